"""The job a RayJob runs: plan the range, run the pipeline, commit, report, emit an event.

``python -m icebatch_job run`` (the RayJob's entrypoint; ``icebatch job run`` by hand, and the local
backend's in-process call) ends in exactly one of: ``nothing_new`` (no engine started), ``completed``
("Batch Job Completed" emitted), ``conflict`` (another run covered the range first; output discarded)
or ``failed`` ("Batch Job Failed" emitted, including on SIGTERM). A failed run commits nothing: its range
stays pending. The steps, in order: ``plan`` -> ``start`` -> ``stream`` -> ``commit`` -> ``completed``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, cast

from icebatch.core.bus import EventPublisher, load_publisher
from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.costs import CostBreakdown, CostInputs, cost_breakdown
from icebatch.core.errors import IcebatchError, TransientError, WatermarkConflictError
from icebatch.core.events import BatchJobCompleted, BatchJobFailed, SnapshotRange, TokenCounts, completed_event
from icebatch.core.ledger import CommitResult, ResultsLedger, RunPlan, RunTotals, open_ledger
from icebatch.core.report import completed_text, incremental_state
from icebatch.core.settings import Settings

from icebatch_job.progress import Progress
from icebatch_job.results import RunStats, batch_engine_seconds

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile

    from icebatch_job.pipeline import BuiltPipeline

log = logging.getLogger(__name__)

Status = Literal["nothing_new", "completed", "conflict", "failed"]
Stage = Literal["plan", "start", "inference", "write", "commit"]


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
    consumer: str | None = None  # by hand, with several consumers: which one


@dataclass
class JobResult:
    status: Status
    plan: RunPlan | None = None
    completed: BatchJobCompleted | None = None
    failed: BatchJobFailed | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "rows": 0}
        if self.plan is not None:
            out.update(
                run_id=self.plan.run_id,
                consumer=self.plan.consumer,
                task_version=self.plan.task_version,
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
        return out


@dataclass
class EngineTiming:
    engine_seconds: float = 0.0  # the streaming LLM stage's wall time
    first_result_seconds: float = 0.0
    startup_seconds: float = 0.0  # the first result's arrival less its batch's engine time


@dataclass
class JobRun:
    """One run's state, handed from step to step."""

    settings: Settings
    consumer: Consumer
    request: JobRequest
    publisher: EventPublisher
    out: Callable[[str], None]
    ledger: ResultsLedger
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    t0: float = field(default_factory=time.monotonic)
    stage: Stage = "plan"
    plan: RunPlan | None = None
    stats: RunStats | None = None
    timing: EngineTiming = field(default_factory=EngineTiming)
    device: str = "-"
    model: str = "-"
    exact_rows: int | None = None  # rows the range holds, when known exactly (no delete files apply)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def totals(self) -> RunTotals:
        assert self.stats is not None
        return self.stats.totals(
            engine_seconds=self.timing.engine_seconds,
            first_result_seconds=self.timing.first_result_seconds,
            engine_startup_seconds=self.timing.startup_seconds,
            job_seconds=self.elapsed,
            model=self.model,
            device=self.device,
            gpus=self.settings.engine.concurrency,
            billing=self.settings.billing(),
            started_at=self.started.isoformat(),
            rayjob_name=self.request.rayjob_name or "",
        )

    def cost(self) -> CostBreakdown:
        s, stats, billing = self.settings, self.stats, self.settings.billing()
        tail = s.top.backend == "kuberay"
        return cost_breakdown(
            CostInputs(
                rows=stats.rows if stats else 0,
                input_tokens=stats.input_tokens if stats else 0,
                output_tokens=stats.output_tokens if stats else 0,
                engine_seconds=self.timing.engine_seconds,
                job_seconds=self.elapsed,
                gpus=s.engine.concurrency,
                hourly_rate=billing.usd_per_hour,
                instance_type=billing.instance_type,
                rate_source=billing.source,
                ttl_seconds=s.cluster.job_ttl_seconds if tail else 0,
                consolidate_seconds=s.cluster.karpenter_consolidate_seconds if tail else 0,
            )
        )


def run_job(
    settings: Settings,
    request: JobRequest | None = None,
    *,
    publisher: EventPublisher | None = None,
    out: Callable[[str], None] = print,
) -> JobResult:
    """Run one job end to end. Raises on failure after emitting "Batch Job Failed"."""
    request = request or JobRequest()
    consumer = consumer_named(load_consumers(settings), request.consumer)
    run = JobRun(
        settings, consumer, request, publisher or load_publisher(settings), out, open_ledger(settings, consumer)
    )
    try:
        if not plan(run):
            return JobResult("nothing_new")
        built = start(run)
        files = stream(run, built)
        commit = commit_run(run, files)
        return completed(run, commit)
    except WatermarkConflictError as e:
        failed = failed_event(run, e, retryable=False)
        run.out(f"conflict: {e}")
        publish(run.publisher, failed)
        return JobResult("conflict", plan=run.plan, failed=failed)
    except BaseException as e:
        publish(
            run.publisher,
            failed_event(run, e, retryable=not isinstance(e, IcebatchError) or isinstance(e, TransientError)),
        )
        raise


def plan(run: JobRun) -> bool:
    """Pin the range (refused if the watermark moved since the launch); False when nothing is new."""
    r = run.request
    run.plan = run.ledger.plan(
        run_id=r.run_id, from_snapshot_exclusive=r.from_snapshot, to_snapshot_inclusive=r.to_snapshot, max_rows=r.limit
    )
    c = run.consumer
    if run.plan is None:
        wm = run.ledger.watermark().source_snapshot_id
        run.out(
            incremental_state(
                consumer=c.name, source_table=c.source_table, from_snapshot=wm, to_snapshot=wm, new_rows=0
            )
        )
        run.out("nothing new: no engine started")
        return False
    p = run.plan
    run.out(
        incremental_state(
            consumer=p.consumer,
            source_table=p.source_table,
            from_snapshot=p.from_snapshot_exclusive,
            to_snapshot=p.to_snapshot_inclusive,
            new_rows=p.expected_rows,
            snapshots=p.snapshots,
        )
    )
    return True


def start(run: JobRun) -> BuiltPipeline:
    """Ray, the read of the range, and the pipeline (the engine starts as the pipeline executes)."""
    from icebatch_job.model import resolve_model
    from icebatch_job.pipeline import build_pipeline
    from icebatch_job.runtime import detect_device, init_ray, prepare_environment
    from icebatch_job.source import read_dataset

    run.stage = "start"
    s, task, p = run.settings, run.consumer.task, run.plan
    assert p is not None
    engine = s.engine
    run.model = (
        resolve_model(s, run.consumer) if engine.engine_mode == "engine" else (engine.endpoint_model or "endpoint")
    )
    init_ray(s, prepare_environment(s, device=engine.device if engine.device != "auto" else "cpu", model=run.model))
    run.device = detect_device(s)
    source, run.exact_rows = read_dataset(run.ledger.source(), p, (task.id_column, *task.input_columns))
    built = build_pipeline(source, task, s, run_id=p.run_id, model=run.model, device=run.device)
    run.model = built.model_name
    return built


def stream(run: JobRun, built: BuiltPipeline) -> list[DataFile]:
    """Stream result rows into (uncommitted) data files, with progress on stderr."""
    from icebatch_job.runner import write_results

    assert run.plan is not None
    run.stats = RunStats(run.consumer.task.label_fields)
    progress = Progress(run.plan.expected_rows)
    progress.note(f"run {run.plan.run_id}: {run.plan.expected_rows:,} rows, model {run.model} ({run.device})")

    def results() -> Iterator[pa.RecordBatch]:
        run.stage = "inference"
        t_engine = time.monotonic()
        try:
            for batch in built.dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                if not run.timing.first_result_seconds:
                    run.timing.first_result_seconds = time.monotonic() - t_engine
                    run.timing.startup_seconds = max(0.0, run.timing.first_result_seconds - batch_engine_seconds(batch))
                for b in cast("pa.Table", batch).to_batches():
                    progress.advance(b.num_rows)
                    yield b
        finally:
            run.timing.engine_seconds = time.monotonic() - t_engine
            progress.close()
        run.stage = "write"

    return write_results(run.ledger, run.consumer.task, results(), run.stats)


def commit_run(run: JobRun, files: list[DataFile]) -> CommitResult:
    """Results and the new watermark, one commit (after the row count and error rate are checked)."""
    from icebatch_job.runner import commit_results

    run.stage = "commit"
    assert run.plan is not None and run.stats is not None
    return commit_results(
        run.ledger,
        run.plan,
        files,
        run.stats,
        run.totals(),
        exact_rows=run.exact_rows,
        max_inference_error_rate=run.settings.engine.max_inference_error_rate,
    )


def completed(run: JobRun, commit: CommitResult) -> JobResult:
    """The report on the console, and "Batch Job Completed" on the bus."""
    assert run.plan is not None and run.stats is not None
    event = completed_event(
        run.plan,
        run.totals(),
        deployment=run.settings.top.deployment,
        rows_by_status=dict(run.stats.statuses),
        labels=run.stats.label_breakdown(),
        cost=run.cost(),
        ledger_snapshot_id=commit.ledger_snapshot_id,
        finished_at=datetime.now(UTC),
    )
    run.out(completed_text(event, include_state=False))
    publish(run.publisher, event)
    return JobResult("completed", plan=run.plan, completed=event)


def failed_event(run: JobRun, error: BaseException, *, retryable: bool) -> BatchJobFailed:
    p, stats = run.plan, run.stats
    reason = str(error) or type(error).__name__
    if isinstance(error, (KeyboardInterrupt, JobInterrupted)):
        reason = "interrupted (SIGTERM/SIGINT): nothing was committed"
    return BatchJobFailed(
        deployment=run.settings.top.deployment,
        run_id=p.run_id if p else run.request.run_id,
        consumer=run.consumer.name,
        task=run.consumer.task.name,
        task_version=run.consumer.task_version,
        source_table=run.consumer.source_table,
        range=SnapshotRange(from_exclusive=p.from_snapshot_exclusive, to_inclusive=p.to_snapshot_inclusive)
        if p
        else None,
        reason=reason[:2000],
        error_type=type(error).__name__,
        stage="commit" if isinstance(error, WatermarkConflictError) else run.stage,
        retryable=retryable,
        rows_processed=stats.rows if stats else 0,
        tokens=TokenCounts(input=stats.input_tokens, output=stats.output_tokens) if stats else None,
        engine_seconds=run.timing.engine_seconds,
        job_seconds=run.elapsed,
        cost=run.cost() if p else None,
        rayjob_name=run.request.rayjob_name,
        started_at=run.started,
        failed_at=datetime.now(UTC),
    )


def publish(publisher: EventPublisher, event: BatchJobCompleted | BatchJobFailed) -> None:
    try:
        event_id = publisher.publish(event)
        log.info("emitted %r (%s)", event.detail_type, event_id)
    except Exception as e:  # the ledger already holds the truth; a lost event is found by reconciliation
        log.error("could not emit %r: %r (the nightly reconciliation will report this run)", event.detail_type, e)
