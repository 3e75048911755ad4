"""`python -m angelps` does what the `angelps` script does: the command line of learners."""

import sys

from learners.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
