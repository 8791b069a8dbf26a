import sys

from icebatch_job.cli import main

if __name__ == "__main__":
    sys.exit(main())
