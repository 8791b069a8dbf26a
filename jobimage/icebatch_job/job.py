"""The job a RayJob runs: plan the range, run the pipeline, commit, report, emit an event.

``icebatch job run`` (the RayJob's entrypoint, and the local backend's in-process call) ends in exactly
one of: ``nothing_new`` (no engine started), ``completed`` ("Batch Job Completed" emitted), ``conflict``
(another run covered the range first; output discarded) or ``failed`` ("Batch Job Failed" emitted from
a ``finally``, including on SIGTERM). A failed run commits nothing: its range stays pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, cast

from icebatch.bus import EventPublisher, load_publisher
from icebatch.costs import CostBreakdown, CostInputs, cost_breakdown
from icebatch.errors import IcebatchError, TransientError, WatermarkConflictError
from icebatch.events import BatchJobCompleted, BatchJobFailed, SnapshotRange, TokenCounts
from icebatch.ledger import RunPlan, open_ledger
from icebatch.report import completed_text, incremental_state
from icebatch.settings import Settings

from icebatch_job.progress import Progress
from icebatch_job.results import RunStats, batch_engine_seconds
from icebatch_job.task import TaskSpec, load_task

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Status = Literal["nothing_new", "completed", "conflict", "failed"]


class JobInterrupted(BaseException):
    """SIGTERM (pod eviction, RayJob deadline, Ctrl-C): stop, report, commit nothing."""


@dataclass(frozen=True)
class JobRequest:
    """What the launcher pins for a run (all optional for a manual run)."""

    run_id: str | None = None
    from_snapshot: int | Literal["watermark"] | None = "watermark"
    to_snapshot: int | None = None
    limit: int | None = None
    rayjob_name: str | None = None


@dataclass
class JobResult:
    status: Status
    plan: RunPlan | None = None
    completed: BatchJobCompleted | None = None
    failed: BatchJobFailed | None = None
    messages: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.plan is not None:
            out.update(
                run_id=self.plan.run_id,
                from_snapshot_exclusive=self.plan.from_snapshot_exclusive,
                to_snapshot_inclusive=self.plan.to_snapshot_inclusive,
            )
        if self.completed is not None:
            e = self.completed
            out.update(
                rows=e.rows,
                rows_ok=e.rows_ok,
                rows_error=e.rows_error,
                rows_by_status=e.rows_by_status,
                input_tokens=e.tokens.input,
                output_tokens=e.tokens.output,
                engine_seconds=round(e.engine_seconds, 3),
                wall_seconds=round(e.job_seconds, 3),
                cost=e.cost.model_dump(),
                new_watermark=e.range.to_inclusive,
                results_location=e.results_location,
                labels=e.labels,
            )
        if self.failed is not None:
            out.update(error_type=self.failed.error_type, reason=self.failed.reason, stage=self.failed.stage)
        if self.status == "nothing_new":
            out["rows"] = 0
        return out


def run_job(
    settings: Settings,
    request: JobRequest | None = None,
    *,
    publisher: EventPublisher | None = None,
    out: Callable[[str], None] = print,
    task: TaskSpec | None = None,
) -> JobResult:
    """Run one job end to end. Raises on failure after emitting "Batch Job Failed"."""
    request = request or JobRequest()
    started = datetime.now(UTC)
    t0 = time.monotonic()
    stage: str = "plan"
    plan: RunPlan | None = None
    stats: RunStats | None = None
    engine_seconds = 0.0
    first_result_seconds = 0.0
    engine_startup_seconds = 0.0
    gpus = settings.concurrency
    billing = settings.billing()
    publisher = publisher or load_publisher(settings)
    try:
        task = task or load_task(settings.task_file)
        ledger = open_ledger(settings)
        plan = ledger.plan(
            run_id=request.run_id,
            from_snapshot_exclusive=request.from_snapshot,
            to_snapshot_inclusive=request.to_snapshot,
            max_rows=request.limit,
        )
        if plan is None:
            wm = ledger.watermark().source_snapshot_id
            out(
                incremental_state(
                    consumer=settings.consumer,
                    source_table=settings.source_table,
                    from_snapshot=wm,
                    to_snapshot=wm,
                    new_rows=0,
                )
            )
            out("nothing new: no engine started")
            return JobResult("nothing_new")
        out(
            incremental_state(
                consumer=plan.consumer,
                source_table=plan.source_table,
                from_snapshot=plan.from_snapshot_exclusive,
                to_snapshot=plan.to_snapshot_inclusive,
                new_rows=plan.expected_rows,
                snapshots=plan.snapshots,
            )
        )

        stage = "start"
        from icebatch_job.model import resolve_model
        from icebatch_job.pipeline import build_pipeline
        from icebatch_job.runner import commit_results, write_results
        from icebatch_job.runtime import detect_device, init_ray, prepare_environment
        from icebatch_job.source import read_dataset

        model = resolve_model(settings) if settings.engine_mode == "engine" else (settings.endpoint_model or "endpoint")
        env = prepare_environment(settings, device=settings.device if settings.device != "auto" else "cpu")
        init_ray(settings, env)
        device = detect_device(settings)
        progress = Progress(plan.expected_rows)
        progress.note(
            f"run {plan.run_id}: {plan.expected_rows:,} rows, model {model} ({settings.engine_mode}, {device})"
        )

        source, exact_rows = read_dataset(ledger.source(), plan, (task.id_column, *task.input_columns))
        built = build_pipeline(source, task, settings, run_id=plan.run_id, model=model, device=device)
        stats = RunStats(task.label_fields)

        def streamed() -> Iterator[pa.RecordBatch]:
            nonlocal stage, engine_seconds, first_result_seconds, engine_startup_seconds
            stage = "inference"
            t_engine = time.monotonic()
            try:
                for batch in built.dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                    if not first_result_seconds:
                        first_result_seconds = time.monotonic() - t_engine
                        engine_startup_seconds = max(0.0, first_result_seconds - batch_engine_seconds(batch))
                    for b in cast("pa.Table", batch).to_batches():
                        progress.advance(b.num_rows)
                        yield b
            finally:
                engine_seconds = time.monotonic() - t_engine
                progress.close()
            stage = "write"

        files = write_results(ledger, task, streamed(), stats)
        stage = "commit"
        commit = commit_results(
            ledger,
            plan,
            files,
            stats,
            exact_rows=exact_rows,
            engine_seconds=engine_seconds,
            extra_summary={
                "task": f"{task.name}@v{task.version}",
                "model": built.model_name,
                "device": device,
                "gpus": str(gpus),
                "gpu-hourly-rate": f"{billing.usd_per_hour:g}",
                "gpu-instance-type": billing.instance_type or "",
                "gpu-rate-source": billing.source,
                "job-seconds": f"{time.monotonic() - t0:.3f}",
                "first-result-seconds": f"{first_result_seconds:.3f}",
                "engine-startup-seconds": f"{engine_startup_seconds:.3f}",
                "rows-truncated": str(stats.truncated),
                "started-at": started.isoformat(),
                "rayjob-name": request.rayjob_name or "",
            },
            max_inference_error_rate=settings.max_inference_error_rate,
        )
        finished = datetime.now(UTC)
        cost = _cost(settings, stats, engine_seconds, time.monotonic() - t0, gpus)
        event = BatchJobCompleted(
            run_id=plan.run_id,
            consumer=plan.consumer,
            source_table=plan.source_table,
            results_table=plan.results_table,
            range=SnapshotRange(from_exclusive=plan.from_snapshot_exclusive, to_inclusive=plan.to_snapshot_inclusive),
            rows=stats.rows,
            rows_ok=stats.ok,
            rows_error=stats.errors,
            rows_by_status=dict(stats.statuses),
            rows_truncated=stats.truncated,
            labels=stats.label_breakdown(),
            tokens=TokenCounts(input=stats.input_tokens, output=stats.output_tokens),
            engine_seconds=engine_seconds,
            first_result_seconds=first_result_seconds,
            engine_startup_seconds=engine_startup_seconds,
            job_seconds=time.monotonic() - t0,
            device=device,
            model=built.model_name,
            cost=cost,
            results_location=f"{plan.results_table}@{commit.ledger_snapshot_id}",
            ledger_snapshot_id=commit.ledger_snapshot_id,
            rayjob_name=request.rayjob_name,
            started_at=started,
            finished_at=finished,
        )
        out(completed_text(event, include_state=False))
        _publish(publisher, event)
        return JobResult("completed", plan=plan, completed=event)
    except WatermarkConflictError as e:
        failed = _failed(
            settings, request, plan, started, t0, stats, engine_seconds, gpus, e, "commit", retryable=False
        )
        out(f"conflict: {e}")
        _publish(publisher, failed)
        return JobResult("conflict", plan=plan, failed=failed)
    except BaseException as e:
        failed = _failed(
            settings,
            request,
            plan,
            started,
            t0,
            stats,
            engine_seconds,
            gpus,
            e,
            stage,
            retryable=not isinstance(e, IcebatchError) or isinstance(e, TransientError),
        )
        _publish(publisher, failed)
        raise


def _cost(
    settings: Settings, stats: RunStats | None, engine_seconds: float, job_seconds: float, gpus: int
) -> CostBreakdown:
    billing = settings.billing()
    return cost_breakdown(
        CostInputs(
            rows=stats.rows if stats else 0,
            input_tokens=stats.input_tokens if stats else 0,
            output_tokens=stats.output_tokens if stats else 0,
            engine_seconds=engine_seconds,
            job_seconds=job_seconds,
            gpus=gpus,
            hourly_rate=billing.usd_per_hour,
            instance_type=billing.instance_type,
            rate_source=billing.source,
            ttl_seconds=settings.job_ttl_seconds if settings.backend == "kuberay" else 0,
            consolidate_seconds=settings.karpenter_consolidate_seconds if settings.backend == "kuberay" else 0,
        )
    )


def _failed(
    settings: Settings,
    request: JobRequest,
    plan: RunPlan | None,
    started: datetime,
    t0: float,
    stats: RunStats | None,
    engine_seconds: float,
    gpus: int,
    error: BaseException,
    stage: str,
    *,
    retryable: bool,
) -> BatchJobFailed:
    job_seconds = time.monotonic() - t0
    reason = str(error) or type(error).__name__
    if isinstance(error, (KeyboardInterrupt, JobInterrupted)):
        reason = "interrupted (SIGTERM/SIGINT): nothing was committed"
    return BatchJobFailed(
        run_id=plan.run_id if plan else request.run_id,
        consumer=settings.consumer,
        source_table=settings.source_table,
        range=SnapshotRange(from_exclusive=plan.from_snapshot_exclusive, to_inclusive=plan.to_snapshot_inclusive)
        if plan
        else None,
        reason=reason[:2000],
        error_type=type(error).__name__,
        stage=stage if stage in {"plan", "start", "inference", "write", "commit"} else "unknown",
        retryable=retryable,
        rows_processed=stats.rows if stats else 0,
        tokens=TokenCounts(input=stats.input_tokens, output=stats.output_tokens) if stats else None,
        engine_seconds=engine_seconds,
        job_seconds=job_seconds,
        cost=_cost(settings, stats, engine_seconds, job_seconds, gpus) if plan else None,
        rayjob_name=request.rayjob_name,
        started_at=started,
        failed_at=datetime.now(UTC),
    )


def _publish(publisher: EventPublisher, event: BatchJobCompleted | BatchJobFailed) -> None:
    try:
        event_id = publisher.publish(event)
        log.info("emitted %r (%s)", event.detail_type, event_id)
    except Exception as e:  # the ledger already holds the truth; a lost event is found by reconciliation
        log.error("could not emit %r: %r (the nightly reconciliation will report this run)", event.detail_type, e)
