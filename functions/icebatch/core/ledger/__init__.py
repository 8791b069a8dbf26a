"""The incremental protocol: what is new, which rows exactly, and recording that they are done.

The unit of progress is the **source snapshot id**. A run processes exactly the rows appended by
``append`` snapshots after the consumer's watermark W (exclusive) up to a pinned snapshot T (inclusive).

Progress lives in the consumer's **results table** (the ledger), never in the source table: the results
of a run and its new watermark are one Iceberg commit whose snapshot summary carries
``icebatch.source-snapshot-id = T`` (plus run id, range, task version and totals). Results and progress
therefore cannot disagree, and the source table stays read-only.

The commit is a compare-and-set: it lands only if the ledger's watermark is still W, the value the run
planned from. At-least-once execution plus this idempotent commit is exactly-once in effect.

Progress is kept per **task version**: a consumer whose task changes version starts over from the
table's first snapshot (or from a snapshot an operator names with ``icebatch ledger reset``), in the same
results table, beside the old version's rows, which stay untouched.

- ``summary``: the keys a commit writes, the watermark and the runs read back;
- ``backlog``: what is new, from the source table's metadata only;
- ``ledger``: ``ResultsLedger`` — plan a range, commit its results and the watermark, reset, discard.

Reading the rows of a range (Arrow batches, a Ray dataset) lives in ``icebatch_job.source``; writing
result rows into data files in ``icebatch_job.results``. Both only hand data files to ``commit`` here.
"""

from icebatch.core.ledger.backlog import Backlog, SkippedSnapshot, compute_backlog, pin_range_end
from icebatch.core.ledger.ledger import CommitResult, ResultsLedger, RunPlan, new_run_id, open_ledger
from icebatch.core.ledger.summary import Key, RunRecord, RunTotals, Watermark, find_run, list_runs, read_watermark

__all__ = [
    "Backlog",
    "CommitResult",
    "Key",
    "ResultsLedger",
    "RunPlan",
    "RunRecord",
    "RunTotals",
    "SkippedSnapshot",
    "Watermark",
    "compute_backlog",
    "find_run",
    "list_runs",
    "new_run_id",
    "open_ledger",
    "pin_range_end",
    "read_watermark",
]
