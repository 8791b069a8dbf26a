"""Executing one planned run: stream result rows into data files, then one ledger commit.

The LLM pipeline (``icebatch_job.job``) and any other producer of result batches go through
``write_results`` and ``commit_results``, so every run gets the same guarantees: rows are counted
against the range before the commit, the commit is the ledger's compare-and-set, and a run that lost
the race discards its files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from icebatch.core.errors import IncompleteRunError, TooManyErrorsError
from icebatch.core.ledger import CommitResult, ResultsLedger, RunPlan, RunTotals
from icebatch.core.task import TaskSpec

from icebatch_job.results import STATUS_ERROR, RunStats, results_arrow_schema, results_schema, write_data_files

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile

log = logging.getLogger(__name__)


def write_results(
    ledger: ResultsLedger, task: TaskSpec, results: Iterable[pa.RecordBatch], stats: RunStats
) -> list[DataFile]:
    """Stream result batches into (uncommitted) data files of the results table, counting as they pass."""
    table = ledger.ensure_results_table(results_schema(task))
    return write_data_files(table, results_arrow_schema(task), stats.stream(results))


def commit_results(
    ledger: ResultsLedger,
    plan: RunPlan,
    files: list[DataFile],
    stats: RunStats,
    totals: RunTotals,
    *,
    exact_rows: int | None,
    max_inference_error_rate: float = 1.0,
) -> CommitResult:
    """Commit the files with the new watermark, after checking that every source row has its result row.

    ``exact_rows`` is the number of source rows in the range when it is known exactly (no delete files
    apply); a different number of result rows means rows were lost or duplicated on the way, and the run
    is refused (IncompleteRunError) before anything becomes visible.
    """
    if exact_rows is not None and stats.rows != exact_rows:
        ledger.discard(files)
        raise IncompleteRunError(
            f"run {plan.run_id} produced {stats.rows} result rows for {exact_rows} source rows; nothing "
            "was committed and the range stays pending"
        )
    failed = stats.statuses[STATUS_ERROR]
    if stats.rows and failed / stats.rows > max_inference_error_rate:
        ledger.discard(files)
        raise TooManyErrorsError(
            f"{failed} of {stats.rows} rows failed in the engine/endpoint (more than "
            f"{max_inference_error_rate:.0%}, ICEBATCH_MAX_INFERENCE_ERROR_RATE); nothing was committed and "
            f"the range stays pending. First error: {str(stats.first_error)[:500]}"
        )
    return ledger.commit(plan, files, totals)
