"""Past runs, rebuilt from the ledger: ``icebatch report [RUN_ID]`` without any event or report file.

The ledger commit of a run holds its totals in the snapshot summary; the label breakdown comes from the
run's result rows. The cost is recomputed with the cost model (the hourly rate the run recorded, the
TTL/consolidation tail of the configured backend).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from icebatch.costs import CostInputs, cost_breakdown
from icebatch.errors import PermanentError
from icebatch.events import BatchJobCompleted, SnapshotRange, TokenCounts
from icebatch.ledger import RunRecord, open_ledger
from icebatch.settings import Settings

from icebatch_job.task import load_task


def completed_from_ledger(settings: Settings, run_id: str | None = None) -> BatchJobCompleted:
    from pyiceberg.expressions import EqualTo

    ledger = open_ledger(settings)
    runs = [r for r in ledger.runs() if not r.run_id.startswith("reset-")]
    if not runs:
        raise PermanentError(f"no runs committed yet for consumer {settings.consumer!r}: run `icebatch job run`")
    record: RunRecord | None = runs[0] if run_id is None else next((r for r in runs if r.run_id == run_id), None)
    if record is None:
        raise PermanentError(f"run {run_id!r} is not in the ledger; `icebatch ledger runs` lists the runs")
    task = load_task(settings.task_file)
    table = ledger.results()
    assert table is not None
    columns = ("status", "input_truncated", *task.label_fields)
    equal_to: Any = EqualTo  # the pydantic mypy plugin misreads EqualTo's own __init__ (differently when cached)
    this_run = equal_to("run_id", record.run_id)
    rows = table.scan(row_filter=this_run, selected_fields=columns).to_arrow().to_pylist()
    statuses = Counter(r["status"] for r in rows)
    labels = {f: dict(Counter(r[f] for r in rows if r[f] is not None).most_common()) for f in task.label_fields}
    p = record.properties
    engine = record.number("engine-seconds")
    job_seconds = record.number("job-seconds", engine)
    gpus = int(record.number("gpus", 1))
    billing = settings.billing()
    cost = cost_breakdown(
        CostInputs(
            rows=int(record.number("rows")),
            input_tokens=int(record.number("input-tokens")),
            output_tokens=int(record.number("output-tokens")),
            engine_seconds=engine,
            job_seconds=job_seconds,
            gpus=gpus,
            hourly_rate=record.number("gpu-hourly-rate", billing.usd_per_hour),
            instance_type=p.get("icebatch.gpu-instance-type") or billing.instance_type,
            rate_source=p.get("icebatch.gpu-rate-source") or billing.source,
            ttl_seconds=settings.job_ttl_seconds if settings.backend == "kuberay" else 0,
            consolidate_seconds=settings.karpenter_consolidate_seconds if settings.backend == "kuberay" else 0,
        )
    )
    finished = datetime.fromtimestamp(record.committed_at_ms / 1000, tz=UTC)
    started_text = p.get("icebatch.started-at")
    started = datetime.fromisoformat(started_text) if started_text else finished
    return BatchJobCompleted(
        run_id=record.run_id,
        consumer=settings.consumer,
        source_table=settings.source_table,
        results_table=settings.results_table,
        range=SnapshotRange(from_exclusive=record.from_snapshot_exclusive, to_inclusive=record.to_snapshot_inclusive),
        rows=int(record.number("rows")),
        rows_ok=int(record.number("rows-ok")),
        rows_error=int(record.number("rows-error")),
        rows_by_status=dict(statuses),
        rows_truncated=int(record.number("rows-truncated")),
        labels=labels,
        tokens=TokenCounts(input=int(record.number("input-tokens")), output=int(record.number("output-tokens"))),
        engine_seconds=engine,
        first_result_seconds=record.number("first-result-seconds"),
        engine_startup_seconds=float(startup) if (startup := p.get("icebatch.engine-startup-seconds")) else None,
        job_seconds=job_seconds,
        device=p.get("icebatch.device", "-"),
        model=p.get("icebatch.model", "-"),
        cost=cost,
        results_location=f"{settings.results_table}@{record.ledger_snapshot_id}",
        ledger_snapshot_id=record.ledger_snapshot_id,
        rayjob_name=p.get("icebatch.rayjob-name") or None,
        started_at=started,
        finished_at=finished,
    )
