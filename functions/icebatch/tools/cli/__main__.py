from icebatch_job.process.runtime import end_process

from icebatch.tools.cli import main

if __name__ == "__main__":
    end_process(main())
