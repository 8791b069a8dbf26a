"""What one attempt of a run reads and what its last commit removes: the range's planned files, the rows
earlier attempts committed, and over a range that deleted or rewrote rows, the rows whose content already
has a verdict (``icebatch_job.plan.identity``). The job (``job.prepare``) and the ledger tests use it alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from icebatch.core.ledger import Key, ResultsLedger, RunPlan
from icebatch.core.ledger.results_table import id_texts
from icebatch.core.task import TaskSpec

from icebatch_job.commit.chunks import RunProgress, load_progress
from icebatch_job.commit.done import DoneRows, committed_rows
from icebatch_job.plan.deletes import readable_deletes
from icebatch_job.plan.identity import labelled_ids, removals, unchanged
from icebatch_job.plan.source import PlannedRange, plan_range, read_rows

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType

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
    if planned.deletes and ledger.consumer.on_delete != "keep":  # the last commit reads the rows live at the end
        readable_deletes(source, plan.to_snapshot_inclusive)
    progress = load_progress(ledger, plan, task)
    skip = progress.done.union(planned.deleted) if len(planned.deleted) else progress.done
    # a first run's rows are matched among themselves only (a reset that moves back labels its range again)
    verdicts = None if planned.whole and not planned.deletes else ledger.results()
    resumed = plan.run_id if plan.resume is not None else None
    if planned.ids_may_repeat and repeats(planned, verdicts, task.version, resumed):
        planned = replace(planned, rewrites=True)  # ids appended again: matched by content, as a rewrite is
    if not planned.rewrites:
        return plan, Work(planned, progress, skip, planned.rows)
    found = unchanged(
        read_rows(planned, skip),
        task.id_column,
        skip,
        verdicts,
        task.version,
        run_id=plan.run_id,
        committed=committed_contents(ledger, plan) if plan.resume else (),
        keep_first=ledger.consumer.on_update == "keep_first",
    )
    rows = planned.rows - found.count
    work = Work(planned, progress, skip.union(found.rows), rows, found.count)
    return replace(plan, expected_rows=rows), work


def source_id_field(source: Table, plan: RunPlan, id_column: str) -> tuple[str, IcebergType] | None:
    """The source's name for the task's id column and the type results hold it in (``results_table.id_type_for``; text
    where the column may be null: a row without an id is kept, its id as the text ``None``, as before ids kept their
    type); None where the plan does not say which field it is (results then hold it as text)."""
    from icebatch.core.ledger.results_table import id_type_for
    from pyiceberg.types import StringType

    reads = {r.task_name: r for r in plan.source_columns.columns} if plan.source_columns else {}
    read = reads.get(id_column)
    if read is None:
        return None
    field = source.schema().find_field(read.field_id)
    return field.name, id_type_for(field.field_type) if field.required else StringType()


def committed_contents(ledger: ResultsLedger, plan: RunPlan) -> list[tuple[str, int | None]]:
    """The (id, content hash) of the rows a run's earlier attempts committed, as its plan saw them (its head): a
    resumed attempt of a range matched by content counts them as sent (``identity.unchanged``)."""
    results = ledger.results()
    assert results is not None  # chunks were committed to it
    hashed = results.schema().find_field("source_hash", case_sensitive=False) is not None
    columns = ("source_id", "source_hash") if hashed else ("source_id",)
    rows = committed_rows(results, plan.run_id, plan.task_version, columns, plan.head_snapshot_id)
    hashes = rows.column("source_hash").to_pylist() if hashed else [None] * rows.num_rows
    return list(zip(id_texts(rows.column("source_id")).to_pylist(), hashes, strict=True))


def repeats(planned: PlannedRange, results: Table | None, task_version: int, run_id: str | None) -> bool:
    """Whether an append-only range repeats an id: twice among its live rows (done ones too: every attempt of a run
    must decide alike), or one with a verdict of ``task_version`` from a run other than ``run_id`` (the run resumed;
    None: a run's first attempt, which has none) -- a writer that retried a commit.
    Reads the range's id column and the results' ids of the task version (``id_bounds`` spares this where the ids
    grow)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import EqualTo

    id_name = planned.content[0]
    only_ids = replace(planned, content=(), schema=planned.schema.select(id_name))  # no content hash: ids alone
    mine = pa.chunked_array([id_texts(b.column(id_name)) for b in read_rows(only_ids, DoneRows())], pa.string())
    if len(mine) == 0:
        return False
    if len(pc.unique(mine)) < len(mine):
        return True
    if results is None or results.current_snapshot() is None:
        return False
    equal_to: Any = EqualTo  # the pydantic mypy plugin misreads these expressions' own __init__
    columns = ("source_id", "run_id") if run_id else ("source_id",)  # a run's first attempt has no verdict yet
    labelled = results.scan(row_filter=equal_to("task_version", task_version), selected_fields=columns).to_arrow()
    # the range's ids are the small set: the results' ids are looked up in it, not the other way round
    hits = labelled.filter(pc.is_in(id_texts(labelled.column("source_id")), value_set=pc.unique(mine)))
    if not run_id:
        return bool(hits.num_rows)
    return bool(hits.num_rows) and bool(pc.any(pc.not_equal(hits.column("run_id"), run_id)).as_py())


def last_commit(
    ledger: ResultsLedger,
    plan: RunPlan,
    task: TaskSpec,
    source: Table,
    work: Work,
    out: Callable[[str], None] = log.info,
) -> LastCommit | None:
    """What the commit that moves the watermark removes and records: over a range matched by content, the verdicts
    of ids gone from the source (where rows may have been deleted) and those this run's verdicts supersede; over
    every range, the upper bound of the source's ids (``plan.id_bounds``). None: nothing of either."""
    ids = {Key.SOURCE_ID_UPPER: work.planned.id_record} if work.planned.id_record else {}
    if not work.planned.rewrites:
        return (lambda _rows: (None, ids)) if ids else None
    renamed = plan.source_columns.renamed if plan.source_columns else {}
    id_column = {t: s for s, t in renamed.items()}.get(task.id_column, task.id_column)

    # an append-only range matched by content (ids it may repeat) deleted nothing: no verdict is looked for as gone
    keep_deleted = ledger.consumer.on_delete == "keep" or not work.planned.deletes

    def removing(rows: pa.Table) -> tuple[Any, dict[str, str]]:
        found = removals(
            source,
            plan.to_snapshot_inclusive,
            id_column,
            ledger.results(),
            plan.run_id,
            plan.task_version,
            labelled_ids(rows),
            keep_deleted=keep_deleted,
        )
        if found.count:
            out(
                f"removing {len(found.gone):,} verdicts of rows deleted from the source and "
                f"{len(found.superseded):,} superseded by this run's"
            )
        notes = {
            Key.ROWS_UNCHANGED: str(work.unchanged),
            Key.VERDICTS_GONE: str(len(found.gone)),
            Key.VERDICTS_SUPERSEDED: str(len(found.superseded)),
            **ids,
        }
        return found.expression(plan.run_id, plan.task_version), notes

    return removing
