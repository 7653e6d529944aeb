"""``python -m tfpar ...``: the ``tfpar`` command."""

import sys

from tfpar.cli import main

sys.exit(main())
