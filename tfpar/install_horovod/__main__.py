"""``python -m tfpar.install_horovod``: the same as ``tfpar install-horovod``."""

import sys

from tfpar.install_horovod import main

if __name__ == "__main__":
    sys.exit(main())
