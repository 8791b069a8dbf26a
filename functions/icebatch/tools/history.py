"""Past runs, rebuilt from the ledger: ``icebatch report [RUN_ID]`` without any event or report file.

The ledger commit of a run holds its totals in the snapshot summary; the label breakdown comes from the
run's result rows. The event is made by the same builder the job uses (``completed_event``), and its
cost recomputed with the cost model (``run_cost``: the hourly rate the run recorded, every attempt's
lifetime and idle tail).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from icebatch.core.consumers import Consumer
from icebatch.core.costs.estimate import run_cost
from icebatch.core.errors import PermanentError
from icebatch.core.events import BatchJobCompleted, completed_event
from icebatch.core.ledger import Key, ResultsLedger, RunPlan, RunRecord, open_ledger
from icebatch.core.settings import Settings


def completed_from_ledger(
    settings: Settings, consumers: list[Consumer], run_id: str | None = None
) -> BatchJobCompleted:
    """The report of ``run_id`` (default: the newest committed run of the consumers)."""
    found = [
        (r, c, ledger)
        for c in consumers
        for ledger in [open_ledger(settings, c)]
        for r in ledger.runs()
        if not r.is_reset
    ]
    if not found:
        names = ", ".join(c.name for c in consumers)
        raise PermanentError(f"no runs committed yet for {names}: run `icebatch job run`")
    if run_id is None:
        readable = [f for f in found if f[0].corrupt is None] or found
        record, consumer, ledger = max(readable, key=lambda f: f[0].committed_at_ms)
    else:
        match = [f for f in found if f[0].run_id == run_id]
        if not match:
            raise PermanentError(f"run {run_id[:80]!r} is not in the ledger; `icebatch ledger runs` lists the runs")
        record, consumer, ledger = match[0]
    if record.corrupt is not None:
        raise PermanentError(f"run {record.run_id[:80]!r} cannot be reported: {record.corrupt}")
    return _rebuild(settings, consumer, ledger, record)


def _rebuild(settings: Settings, consumer: Consumer, ledger: ResultsLedger, record: RunRecord) -> BatchJobCompleted:
    totals = record.totals(settings.billing())
    statuses, labels = _breakdown(ledger, consumer, record.run_id)
    cost = run_cost(totals, settings)
    plan = RunPlan(
        run_id=record.run_id,
        consumer=consumer.name,
        task=record.task or consumer.task.name,
        task_version=record.task_version,
        source_table=consumer.source_table,
        results_table=consumer.results_table,
        from_snapshot_exclusive=record.from_snapshot_exclusive,
        to_snapshot_inclusive=record.to_snapshot_inclusive,
        expected_rows=totals.rows,
        snapshots=0,
    )
    return completed_event(
        plan,
        totals,
        deployment=settings.top.deployment,
        rows_by_status=statuses,
        labels=labels,
        cost=cost,
        ledger_snapshot_id=record.ledger_snapshot_id,
        finished_at=datetime.fromtimestamp(record.committed_at_ms / 1000, tz=UTC),
        chunks=int(record.number(Key.CHUNK, 1)),
        row_noun=consumer.row_noun,
        rows_unchanged=int(record.number(Key.ROWS_UNCHANGED)),
        verdicts_removed=int(record.number(Key.VERDICTS_GONE) + record.number(Key.VERDICTS_SUPERSEDED)),
    )


def _breakdown(
    ledger: ResultsLedger, consumer: Consumer, run_id: str
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    from pyiceberg.expressions import EqualTo

    table = ledger.results()
    assert table is not None
    fields = consumer.task.label_fields
    equal_to: Any = EqualTo  # the pydantic mypy plugin misreads EqualTo's own __init__ (differently when cached)
    rows = table.scan(row_filter=equal_to("run_id", run_id), selected_fields=("status", *fields)).to_arrow().to_pylist()
    statuses = dict(Counter(r["status"] for r in rows))
    labels = {f: dict(Counter(r[f] for r in rows if r[f] is not None).most_common()) for f in fields}
    return statuses, labels
