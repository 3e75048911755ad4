"""`python -m angelps` does what the `angelps` script does."""

import sys

from angelps.cli import main

if __name__ == "__main__":
    sys.exit(main())
