"""What one attempt of a run reads and what its last commit removes: the range's planned files, the rows
earlier attempts committed, and over a range that deleted or rewrote rows, the rows whose content already
has a verdict (``icebatch_job.plan.identity``). The job (``job.prepare``) and the ledger tests use it alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from icebatch.core.ledger import Key, ResultsLedger, RunPlan
from icebatch.core.task import TaskSpec

from icebatch_job.commit.chunks import RunProgress, load_progress
from icebatch_job.commit.done import DoneRows
from icebatch_job.plan.identity import labelled_ids, removals, unchanged
from icebatch_job.plan.source import PlannedRange, plan_range, read_rows

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

LastCommit = Callable[["pa.Table"], tuple[Any, dict[str, str]]]  # its rows -> (a delete filter, summary notes)


@dataclass(frozen=True)
class Work:
    planned: PlannedRange
    progress: RunProgress
    skip: DoneRows  # rows not to read: done, or unchanged
    range_rows: int  # the rows of the range that get a result row
    unchanged: int = 0

    @property
    def todo(self) -> int:
        return self.range_rows - len(self.progress.done)


def plan_work(ledger: ResultsLedger, plan: RunPlan, task: TaskSpec, source: Table) -> tuple[RunPlan, Work]:
    """The attempt's work, and its plan (over a range that rewrote rows, ``expected_rows`` counts the rows that
    get a result row: the unchanged ones do not)."""
    planned = plan_range(source, plan, (task.id_column, *task.input_columns))
    progress = load_progress(ledger, plan, task)
    skip = progress.done.union(planned.deleted) if len(planned.deleted) else progress.done
    if not planned.rewrites:
        return plan, Work(planned, progress, skip, planned.rows)
    found = unchanged(read_rows(planned, skip), task.id_column, skip, ledger.results(), task.version,
                      keep_first=ledger.consumer.on_update == "keep_first")  # fmt: skip
    rows = planned.rows - found.count
    work = Work(planned, progress, skip.union(found.rows), rows, found.count)
    return replace(plan, expected_rows=rows), work


def last_commit(
    ledger: ResultsLedger, plan: RunPlan, task: TaskSpec, source: Table, work: Work,
    out: Callable[[str], None] = log.info,
) -> LastCommit | None:  # fmt: skip
    """Over a range that deleted or rewrote rows: what the commit that moves the watermark removes (verdicts of
    ids gone from the source, and those this run's verdicts supersede) and records."""
    if not work.planned.rewrites:
        return None
    renamed = plan.source_columns.renamed if plan.source_columns else {}
    id_column = {t: s for s, t in renamed.items()}.get(task.id_column, task.id_column)

    keep_deleted = ledger.consumer.on_delete == "keep"

    def removing(rows: pa.Table) -> tuple[Any, dict[str, str]]:
        found = removals(source, plan.to_snapshot_inclusive, id_column, ledger.results(), plan.run_id,
                         plan.task_version, labelled_ids(rows), keep_deleted=keep_deleted)  # fmt: skip
        if found.count:
            out(f"removing {len(found.gone):,} verdicts of rows deleted from the source and "
                f"{len(found.superseded):,} superseded by this run's")  # fmt: skip
        notes = {Key.ROWS_UNCHANGED: str(work.unchanged), Key.VERDICTS_GONE: str(len(found.gone)),
                 Key.VERDICTS_SUPERSEDED: str(len(found.superseded))}  # fmt: skip
        return found.expression(plan.run_id, plan.task_version), notes

    return removing
