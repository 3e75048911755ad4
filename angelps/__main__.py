"""`python -m angelps` does what the `angelps` script does: the command line of learners."""

from learners.cli.main import run

if __name__ == "__main__":
    run()
