"""``python -m tfpar.cli``: the ``tfpar`` command."""

import sys

from tfpar.cli import main

if __name__ == "__main__":
    sys.exit(main())
