from icebatch_job.cli import main
from icebatch_job.process.runtime import end_process

if __name__ == "__main__":
    end_process(main())
