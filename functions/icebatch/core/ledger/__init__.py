"""The incremental protocol: what is new, which rows exactly, and recording that they are done.

The unit of progress is the **source snapshot id**. A run processes exactly the rows appended by
``append`` snapshots after the consumer's watermark W (exclusive) up to a pinned snapshot T (inclusive).

Progress lives in the consumer's **results table** (the ledger), never in the source table: the results
of a run and its new watermark are one Iceberg commit whose snapshot summary carries
``icebatch.source-snapshot-id = T`` (plus run id, range, task version and totals). Results and progress
therefore cannot disagree, and the source table stays read-only.

A run commits its range in **chunks** (``ICEBATCH_CHUNK_ROWS``), so that a crash or a spot interruption
loses at most the unfinished chunk. Each chunk is one Iceberg commit of its result rows and the run's
progress (run id, range, chunk number, rows committed); its rows carry ``source_file``/``source_pos``,
which name exactly which source rows are done (the data files of append snapshots are immutable). Only
the run's last chunk moves the watermark to T. A new attempt of the run (a retry, the next launch, a
manual run) finds the chunks committed after W, reads their positions and processes only the rest.

Every commit is a compare-and-set on the **progress head** (the newest commit of the task version): it
lands only if the head is still the one the attempt last saw. At-least-once execution plus this
idempotent commit is exactly-once in effect, per chunk.

Progress is kept per **task version**: a consumer whose task changes version starts over from the
table's first snapshot (or from a snapshot an operator names with ``icebatch ledger reset``), in the same
results table, beside the old version's rows, which stay untouched.

- ``summary``: the keys a commit writes, the watermark and the runs read back;
- ``backlog``: what is new, from the source table's metadata only;
- ``ledger``: ``ResultsLedger`` — plan (or resume) a range, commit its chunks, reset, discard.

Reading the rows of a range (Arrow batches, a Ray dataset) lives in ``icebatch_job.plan.source``;
writing result rows into data files in ``icebatch_job.commit.results``; cutting a run into chunks in
``icebatch_job.commit.chunks``.
"""

from icebatch.core.ledger.backlog import Backlog, SkippedSnapshot, compute_backlog, pin_range_end
from icebatch.core.ledger.ledger import (
    Chunk,
    CommitResult,
    ProgressRaceError,
    ResultsLedger,
    RunPlan,
    new_run_id,
    open_ledger,
    superseded_by_run,
    superseded_filter,
)
from icebatch.core.ledger.summary import (
    Key,
    Pending,
    Progress,
    RunRecord,
    RunTotals,
    Watermark,
    find_commit,
    find_run,
    list_runs,
    read_progress,
    read_watermark,
)

__all__ = [
    "Backlog",
    "Chunk",
    "CommitResult",
    "Key",
    "Pending",
    "Progress",
    "ProgressRaceError",
    "ResultsLedger",
    "RunPlan",
    "RunRecord",
    "RunTotals",
    "SkippedSnapshot",
    "Watermark",
    "compute_backlog",
    "find_commit",
    "find_run",
    "list_runs",
    "new_run_id",
    "open_ledger",
    "pin_range_end",
    "read_progress",
    "read_watermark",
    "superseded_by_run",
    "superseded_filter",
]
