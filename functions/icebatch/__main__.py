"""``python -m icebatch``: the ``icebatch`` command line."""

import sys

from icebatch.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
