"""``python -m relmql``: the same command line as ``relmql``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
