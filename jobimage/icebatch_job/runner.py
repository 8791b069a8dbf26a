"""Executing one planned run: stream result rows into data files, then one ledger commit.

The LLM pipeline (``icebatch_job.pipeline``) and any other producer of result batches go through
``execute``, so every run gets the same guarantees: rows are counted against the range before the
commit, the commit is the ledger's compare-and-set, and a run that lost the race discards its files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icebatch.errors import IncompleteRunError
from icebatch.ledger import CommitResult, ResultsLedger, RunPlan

from icebatch_job.results import RunStats, results_arrow_schema, results_schema, write_data_files
from icebatch_job.task import TaskSpec

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutedRun:
    plan: RunPlan
    stats: RunStats
    commit: CommitResult


def execute(
    ledger: ResultsLedger,
    plan: RunPlan,
    task: TaskSpec,
    results: Iterable[pa.RecordBatch],
    *,
    exact_rows: int | None = None,
    engine_seconds: float = 0.0,
    extra_summary: dict[str, str] | None = None,
) -> ExecutedRun:
    """Write ``results`` for ``plan`` and commit them with the new watermark.

    ``exact_rows`` is the number of source rows in the range when it is known exactly (no delete files
    apply); a different number of result rows means rows were lost or duplicated on the way, and the run
    is refused (IncompleteRunError) before anything becomes visible.
    """
    table = ledger.ensure_results_table(results_schema(task))
    stats = RunStats(task.label_fields)
    files = write_data_files(table, results_arrow_schema(task), stats.stream(results))
    if exact_rows is not None and stats.rows != exact_rows:
        ledger.discard(files)
        raise IncompleteRunError(
            f"run {plan.run_id} produced {stats.rows} result rows for {exact_rows} source rows; nothing "
            "was committed and the range stays pending"
        )
    totals = stats.totals(engine_seconds=engine_seconds, extra=extra_summary)
    commit = ledger.commit(plan, files, totals)
    return ExecutedRun(plan, stats, commit)
