"""The job a RayJob runs: plan (or resume) the range, run the pipeline, commit it in chunks, report.

``python -m icebatch_job run`` (the RayJob's entrypoint; ``icebatch job run`` by hand, and the local
backend's in-process call) ends in exactly one of: ``nothing_new`` (no engine started), ``completed``
("Batch Job Completed" emitted), ``deferred`` (a run given no GPU whose range needs the model: nothing
committed, the next attempt gets one), ``conflict`` (another run covered the range first; output discarded)
or ``failed`` ("Batch Job Failed" emitted, including on SIGTERM). The rows a failed attempt committed
stay committed (``resumable``): the next attempt of the run processes only the rest of its range.
The steps, in order: ``plan`` -> ``start`` -> ``stream`` (chunks are committed as rows finish) ->
``commit`` (the last chunk, with the watermark) -> ``completed``. A job whose range kept the engine busy may then
linger (``icebatch_job.linger``): it keeps its node for an idle window and takes the rows that land, each range
a run of its own through the same steps (``JobResult.lingered``). A shared job (``icebatch_job.shared``: ``--with``)
takes several consumers' runs through one engine, each through the same steps (``JobResult.shared``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, cast

from icebatch.core.bus import EventPublisher, load_publisher
from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.costs.before_job import BeforeJob, split
from icebatch.core.costs.estimate import run_cost
from icebatch.core.costs.report import completed_text, incremental_state
from icebatch.core.errors import IcebatchError, TransientError, WatermarkConflictError
from icebatch.core.events import (
    BatchJobCompleted,
    BatchJobDeferred,
    BatchJobFailed,
    SnapshotRange,
    TokenCounts,
    completed_event,
)
from icebatch.core.failpoints import arm
from icebatch.core.ledger import CommitResult, Key, ResultsLedger, RunPlan, RunTotals, open_ledger
from icebatch.core.ledger.summary import as_recorded
from icebatch.core.settings import Settings
from icebatch.core.terminal import console
from icebatch.core.untrusted import one_line

from icebatch_job.commit.chunks import Attempt, ChunkCommitter, ChunkPolicy, run_totals
from icebatch_job.commit.results import RunStats, batch_engine_seconds
from icebatch_job.commit.sharing import Sharing
from icebatch_job.linger import Linger
from icebatch_job.process.engine_start import EngineStart, engine_start
from icebatch_job.process.interrupts import Interrupts, JobInterrupted, JobStalled
from icebatch_job.process.stall import StallWatch
from icebatch_job.progress import Progress

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

    from icebatch_job.plan.work import Work
    from icebatch_job.stages.inputs import RunSource
    from icebatch_job.stages.pipeline import BuiltPipeline

log = logging.getLogger(__name__)

Status = Literal["nothing_new", "completed", "deferred", "conflict", "failed"]
Stage = Literal["plan", "start", "inference", "write", "commit"]


@dataclass(frozen=True)
class JobRequest:
    """What the launcher pins for a run (all optional for a manual run)."""

    run_id: str | None = None
    from_snapshot: int | Literal["watermark"] | None = "watermark"
    to_snapshot: int | None = None
    limit: int | None = None
    rayjob_name: str | None = None
    consumer: str | None = None  # by hand, with several consumers: which one
    linger: bool = True  # False: end once the range is committed, whatever the consumer's idle window
    # other consumers' runs the job takes through one engine (``icebatch_job.shared``); it lingers for them too
    shared_with: tuple[JobRequest, ...] = ()


@dataclass
class JobResult:
    status: Status
    plan: RunPlan | None = None
    completed: BatchJobCompleted | None = None
    failed: BatchJobFailed | None = None
    chunk_commit_seconds: float = 0.0  # writing and committing the chunks before the last (this attempt)
    timeline: dict[str, float] = field(default_factory=dict)  # EngineTiming.timeline (wall-clock epochs)
    linger: Linger | None = None  # whether the job kept its node after this run (decided before its last commit)
    lingered: list[JobResult] = field(default_factory=list)  # the runs the job took while it lingered
    shared: list[JobResult] = field(default_factory=list)  # the other runs of a shared job (``JobRequest.shared_with``)

    @property
    def job_status(self) -> Status:
        """The job's: this run's, unless a run it shared its engine with failed or lost its range, or a run it took
        while it lingered failed (its exit status)."""
        statuses = {r.status for r in self.shared} | {self.status}
        statuses |= {"failed" for r in self.lingered if r.job_status == "failed"}
        return next((s for s in ("failed", "conflict") if s in statuses), self.status)

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
                chunks=e.chunks,
                chunk_commit_seconds=round(self.chunk_commit_seconds, 3),
                **self.timeline,
            )
        if self.failed is not None:
            out.update(error_type=self.failed.error_type, reason=self.failed.reason, stage=self.failed.stage)
        if self.linger is not None:
            kept = self.linger
            out["linger"] = {"kept": kept.keeps, "seconds": round(kept.seconds, 3), "why": kept.why}
        if self.lingered:
            out["lingered"] = [r.to_json() for r in self.lingered]
        if self.shared:
            out["shared"] = [r.to_json() for r in self.shared]
        return out


@dataclass
class EngineTiming:
    started: float | None = None  # when the pipeline started executing (monotonic)
    ended: float | None = None
    first_result_seconds: float = 0.0
    startup_seconds: float = 0.0  # the first result's arrival less its batch's engine time
    started_at: float = 0.0  # ``started`` on the wall clock (``time.time()``), for other processes to compare
    engine_start: EngineStart = field(default_factory=EngineStart)  # the start-up's checkpoint load and warm-up

    def first_result(self, batch: pa.Table, progress: Progress) -> None:
        """The first result arrived (as ``batch``): the start-up is over, and vLLM has said what it spent on what."""
        assert self.started is not None
        self.first_result_seconds = time.monotonic() - self.started
        self.startup_seconds = max(0.0, self.first_result_seconds - batch_engine_seconds(batch))
        self.engine_start = engine_start(since=self.started_at)
        progress.note(f"engine ready: first answers after {self.first_result_seconds:.0f} s")

    def timeline(self) -> dict[str, float]:
        """Wall-clock epochs of the first token (estimated as ``startup_seconds``) and of the last result."""
        if self.started is None or self.ended is None:
            return {}
        return {
            "first_token_at": round(self.started_at + self.startup_seconds, 3),
            "last_result_at": round(self.started_at + (self.ended - self.started), 3),
        }

    @property
    def engine_seconds(self) -> float:
        """The streaming LLM stage's wall time so far."""
        if self.started is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.started


@dataclass
class JobRun:
    """One attempt's state, handed from step to step."""

    settings: Settings
    consumer: Consumer
    request: JobRequest
    publisher: EventPublisher
    out: Callable[[str], None]
    ledger: ResultsLedger
    interrupts: Interrupts | None = None
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    stage: Stage = "plan"
    plan: RunPlan | None = None
    attempt: Attempt = field(default_factory=lambda: Attempt(1, secrets.token_hex(4)))
    committer: ChunkCommitter | None = None
    timing: EngineTiming = field(default_factory=EngineTiming)
    device: str = "-"
    model: str = "-"
    chunk_rows: int = 0  # the chunk this attempt uses (``window.chunk_size``)
    source: Table | None = None  # the source table as planned
    work: Work | None = None  # what the attempt reads (``prepare``)
    warm: bool = False  # taken by a job that lingered after another run (``icebatch_job.linger``)
    linger: Linger | None = None  # decided when the range is drained, before its last commit
    job_started: float = field(default_factory=time.monotonic)  # the job's, not the run's (a lingering job's runs)
    sharing: Sharing | None = None  # a shared job's runs (``icebatch_job.shared``): how they split the node
    before_job: BeforeJob = field(default_factory=BeforeJob)  # the launch to this process (``before_the_job``)

    @property
    def elapsed(self) -> float:
        return self.attempt.seconds

    @property
    def elapsed_in_job(self) -> float:
        return time.monotonic() - self.job_started

    def totals(self, stats: RunStats, redone: int) -> RunTotals:
        """The run's totals so far (``chunks.run_totals``), with what this attempt measured."""
        assert self.plan is not None
        return run_totals(
            self.plan,
            stats,
            redone,
            attempt_seconds=self.elapsed,
            engine_seconds=self.timing.engine_seconds,
            started_at=self.started.isoformat(),
            before_job=self.before_job,
            first_result_seconds=self.timing.first_result_seconds,
            engine_startup_seconds=self.timing.startup_seconds,
            engine_weights_seconds=self.timing.engine_start.weights_seconds,
            engine_warmup_seconds=self.timing.engine_start.warmup_seconds,
            model=self.model,
            device=self.device,
            gpus=self.settings.engine.concurrency,
            billing=self.settings.billing(),
            rayjob_name=self.request.rayjob_name or "",
            warm=self.warm,
            # the job's last window, paid by the run that first kept the node (``icebatch_job.linger``)
            linger_seconds=self.linger.seconds
            if self.linger is not None and self.linger.keeps and not self.warm
            else 0,
            **(self.sharing.split(self.consumer.name) if self.sharing is not None else {}),
        )


def run_job(
    settings: Settings,
    request: JobRequest | None = None,
    *,
    publisher: EventPublisher | None = None,
    out: Callable[[str], None] = print,
    interrupts: Interrupts | None = None,
) -> JobResult:
    """Run one attempt end to end. Raises on failure after emitting "Batch Job Failed".

    ``interrupts`` (the command line's) makes SIGTERM commit the finished rows before the job stops.
    """
    request = request or JobRequest()
    arm(settings.progress.failpoint, settings.home)
    if request.shared_with:
        raise ValueError("a request with shared_with is a shared job's: icebatch_job.shared.run_request runs it")
    consumer = consumer_named(load_consumers(settings), request.consumer)
    run = JobRun(
        settings,
        consumer,
        request,
        publisher or load_publisher(settings),
        out,
        open_ledger(settings, consumer),
        interrupts,
        before_job=before_the_job(settings),
    )
    result = run_range(run)
    if run.linger is not None and run.linger.keeps:
        result.lingered = linger(run)
    return result


def before_the_job(settings: Settings) -> BeforeJob:
    """The launcher's submission (``ICEBATCH_JOB_LAUNCHED_AT``) to now, the job's start: the GPU node, the image pull
    and the Ray cluster's start, which the node is billed for too; split at this node's boot and its container's
    start (``engine_node_split`` splits it again at the GPU node's, once Ray is up). None for a job run by hand, and
    for one that starts later than a cluster may take to come up (``ICEBATCH_JOB_START_DEADLINE_SECONDS``): a KubeRay
    retry of the same RayJob, whose first attempt's time its own report holds."""
    from icebatch_job.process.node_clock import node_clock

    launched, now = settings.top.job_launched_at, time.time()
    if launched is None:
        return BeforeJob()
    limit = settings.kubernetes.job_start_deadline_seconds or settings.kubernetes.job_deadline_seconds
    if not 0 <= now - launched <= limit:
        log.info("not billing %.0f s before the job: more than a cluster takes to start (a retry)", now - launched)
        return BeforeJob()
    return split(launched, now, *node_clock())


def engine_node_split(runs: list[JobRun]) -> None:
    """Split the runs' time before the job again where the GPU node the engine runs on says it went (Ray is up)."""
    from icebatch_job.process.node_clock import engine_node_clock

    launched, before = runs[0].settings.top.job_launched_at, runs[0].before_job
    if launched is None or not before.seconds or (clock := engine_node_clock()) is None:
        return
    for run in runs:
        run.before_job = split(launched, launched + before.seconds, *clock)


def run_range(run: JobRun) -> JobResult:
    """One run's range: plan, start, stream, commit, report."""
    try:
        if not plan(run):
            return JobResult("nothing_new")
        if prepare(run):
            if run.settings.top.job_engine == "off":
                return deferred(run)
            built = start(run)
            stream(run, built)
            run.linger = decide_linger(run)
        commit = commit_run(run)
        return completed(run, commit)
    except WatermarkConflictError as e:
        return conflicted(run, e)
    except BaseException as e:
        publish(
            run.publisher,
            failed_event(run, e, retryable=not isinstance(e, IcebatchError) or isinstance(e, TransientError)),
        )
        raise


def decide_linger(run: JobRun, group: Sequence[JobRun] = ()) -> Linger:
    """Whether the job keeps its node once this run is committed (``icebatch_job.linger``): recorded with the run's
    last commit, which pays for the window. ``group``: a shared job's runs (``run`` among them, first), decided as
    one (``linger.decide_group``)."""
    from icebatch_job.linger import decide_group

    s = run.settings
    if not run.request.linger:
        return Linger(0.0, False, "--no-linger")
    # a RayJob is stopped at its deadline: the job takes no more rows past half of it (a run needs the rest)
    if s.top.backend == "kuberay" and run.elapsed_in_job > s.kubernetes.job_deadline_seconds / 2:
        return Linger(0.0, False, "past half of ICEBATCH_JOB_DEADLINE_SECONDS")
    try:
        return decide_group([(r.ledger, r.consumer) for r in group or [run]], s)
    except Exception as e:  # the run's range is what matters: a source that cannot be read now ends the job
        log.warning("not lingering: %s", one_line(str(e), 300))
        return Linger(0.0, False, f"could not read the source: {type(e).__name__}")


def waited_for_rows(ledgers: Sequence[ResultsLedger], window: Linger, who: str, out: Callable[[str], None]) -> bool:
    """The lingering job's wait (``linger.wait_for_rows``) for rows of any of ``ledgers``: True when some landed; False
    when the window passed, a signal came (nothing was in progress) or the sources cannot be read now (a catalog
    error, throttling: the runs taken stand)."""
    from icebatch_job.linger import wait_for_rows

    try:
        console.phase(f"{who}: lingering up to {window.seconds:.0f} s for new rows ({window.why})")
        if wait_for_rows(ledgers, window):
            return True
        out(f"no new rows within {window.seconds:.0f} s: the job ends")
    except JobInterrupted:
        out("stopped while lingering: nothing was in progress")
    except Exception as e:
        log.warning("stopped lingering: %s", one_line(str(e), 300))
    return False


def linger(first: JobRun) -> list[JobResult]:
    """Keep the node while rows land (``icebatch_job.linger``): each range a run of its own, till a window passes
    with none, a signal stops the job, or the consumer's rule says the rows no longer pay for the node."""
    results: list[JobResult] = []
    run = first
    while run.linger is not None and run.linger.keeps:
        window, drained, drained_at = run.linger, time.monotonic(), datetime.now(UTC)
        if not waited_for_rows([run.ledger], window, first.consumer.name, run.out):
            break
        request = JobRequest(rayjob_name=first.request.rayjob_name, consumer=first.consumer.name)
        run = JobRun(
            first.settings,
            first.consumer,
            request,
            first.publisher,
            first.out,
            first.ledger,
            first.interrupts,
            started=drained_at,
            attempt=Attempt(1, secrets.token_hex(4), drained),  # its time runs from the commit before it: the wait
        )
        run.warm, run.job_started = True, first.job_started
        result = run_range(run)
        results.append(result)
        if result.status != "completed":
            break
    return results


def conflicted(run: JobRun, error: WatermarkConflictError) -> JobResult:
    """Another run covered the range (before this attempt began, or while it ran: its output was discarded).

    A race, not a failure: no "Batch Job Failed" (on AWS an email and an alarm for an operator who has nothing
    to do), one line saying which run covered it, and the exit status of a conflict (5). What a discarded
    attempt cost is logged."""
    run.out(f"conflict: {error}")
    if run.plan is None:  # covered before this attempt began: nothing was done
        log.info("range already covered: %s", error)
        return JobResult("conflict")
    c = run.committer
    if c is not None and c.received:
        totals = run.totals(c.stats, c.redone)
        log.warning(
            "run %s lost its range to another run after %d result rows (%.0f s of engine time, $%.4f): "
            "discarded, not reported as a failure",
            run.plan.run_id,
            c.received,
            run.timing.engine_seconds,
            run_cost(totals, run.settings).lifetime_cost,
        )
    return JobResult("conflict", plan=run.plan)


def deferred(run: JobRun) -> JobResult:
    """A run the launcher gave no GPU (rows deleted or rewritten, none added) whose range holds rows the model must
    see (content a copy-on-write ``UPDATE`` or ``MERGE`` changed): nothing is committed and no engine started. Not
    a failure: "Batch Job Deferred" tells the launcher, which gives the range's next attempt a GPU at once
    (``launcher.job_spec``; else the next trigger does)."""
    assert run.plan is not None and run.work is not None
    p = run.plan
    run.out(
        f"deferred: {run.work.todo:,} {run.consumer.row_noun} of the range changed and need the model, which "
        "this run (no GPU) does not start; nothing committed: the launcher gives the range's next attempt a GPU"
    )
    publish(
        run.publisher,
        BatchJobDeferred(
            deployment=run.settings.top.deployment,
            run_id=p.run_id,
            consumer=p.consumer,
            source_table=p.source_table,
            range=SnapshotRange(from_exclusive=p.from_snapshot_exclusive, to_inclusive=p.to_snapshot_inclusive),
            rows_for_the_model=run.work.todo,
            rayjob_name=run.request.rayjob_name,
            deferred_at=datetime.now(UTC),
        ),
    )
    return JobResult("deferred", plan=run.plan)


def plan(run: JobRun) -> bool:
    """Pin the range (refused if the watermark moved since the launch); False when nothing is new."""
    r = run.request
    run.source = run.ledger.source()  # loaded once for the plan and the read (a long history takes seconds)
    try:
        run.plan = run.ledger.plan(
            run_id=r.run_id,
            from_snapshot_exclusive=r.from_snapshot,
            to_snapshot_inclusive=r.to_snapshot,
            max_rows=r.limit,
            source=run.source,
        )
    except WatermarkConflictError:
        if r.run_id is None or run.ledger.find_run(r.run_id) is None:
            raise
        # a KubeRay retry of a job whose run committed before something else failed (a shared job's other run, the
        # event after the commit): the range is this run's own, done; not a conflict (exit 5, a failed RayJob)
        run.out(f"run {r.run_id} already committed its range (an earlier attempt of this job): nothing to do")
        return False
    c = run.consumer
    if run.plan is None:
        wm = run.ledger.watermark().source_snapshot_id
        state = incremental_state(
            consumer=c.name, source_table=c.source_table, from_snapshot=wm, to_snapshot=wm, new_rows=0, noun=c.row_noun
        )
        run.out(state)
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
            noun=c.row_noun,
        )
    )
    if p.resume is not None:
        run.attempt = Attempt(p.resume.attempts + 1, run.attempt.id, run.attempt.started)
        run.out(
            f"resuming {p.resume.describe()}; attempt {run.attempt.number} does the other {p.resume.rows_remaining:,}"
        )
    return True


def prepare(run: JobRun) -> bool:
    """What this attempt reads (``icebatch_job.plan.work``): False when no row is left to send to the model (the last
    commit is then made without starting Ray or the engine)."""
    from icebatch_job.plan.work import plan_work

    s, task, p = run.settings, run.consumer.task, run.plan
    assert p is not None
    source = run.source = run.source or run.ledger.source()
    run.plan, run.work = plan_work(run.ledger, p, task, source)
    if run.work.planned.rewrites:
        w = run.work
        run.out(
            f"{w.unchanged:,} of the range's {w.planned.rows:,} rows have a verdict for the same content (not "
            "sent to the model); verdicts of deleted and changed rows go with the last commit"
        )
    run.committer = _committer(run, ChunkPolicy(s.progress.chunk_rows, 0.0, s.engine.max_inference_error_rate))
    return run.work.todo > 0


def _committer(run: JobRun, policy: ChunkPolicy, release: Callable[[int], None] = lambda _rows: None) -> ChunkCommitter:
    from icebatch_job.plan.work import last_commit, source_id_field

    p, work, task = run.plan, run.work, run.consumer.task
    assert p is not None and work is not None and run.source is not None
    return ChunkCommitter(
        run.ledger,
        p,
        task,
        start=work.progress,
        range_rows=work.range_rows,
        policy=policy,
        attempt=run.attempt,
        totals=run.totals,
        guard=run.interrupts.critical if run.interrupts else nullcontext,
        release=release,
        finalize=last_commit(run.ledger, p, task, run.source, work, run.out),
        source_id=source_id_field(run.source, p, task.id_column),
    )


def start(run: JobRun) -> BuiltPipeline:
    """Ray, what is already done, the read of the rest of the range, and the pipeline (the engine starts
    as the pipeline executes). The driver imports what the build needs while Ray starts
    (``icebatch_job.process.warm_imports``)."""
    with start_ray(run) as every:
        built = _build(run, every)
        if run.interrupts is not None:
            run.interrupts.install()  # and again: Ray Data LLM's processor build calls ray.init once more
    run.model = built.model_name
    return built


@contextmanager
def start_ray(run: JobRun, also: Sequence[JobRun] = ()) -> Iterator[int]:
    """Ray up for ``run`` (its chunk, model and device decided) and the runs it shares its engine with (``also``);
    yields how many finished rows make a commit. The driver imports what the pipeline's build needs while Ray starts,
    till the block ends."""
    from icebatch_job.commit.window import chunk_size, commit_every
    from icebatch_job.process.runtime import init_ray, prepare_environment
    from icebatch_job.process.warm_imports import imports_in_background
    from icebatch_job.stages.model import resolve_model
    from icebatch_job.stages.pipeline import in_flight_rows

    run.stage = "start"
    s, engine = run.settings, run.settings.engine
    in_flight = in_flight_rows(s)
    run.chunk_rows = chunk_size(s.progress.chunk_rows, in_flight)
    if run.chunk_rows != s.progress.chunk_rows:
        log.info(
            "chunks of %d rows: ICEBATCH_CHUNK_ROWS=%d is less than twice the %d rows %d replica(s) keep in flight",
            run.chunk_rows,
            s.progress.chunk_rows,
            in_flight,
            s.engine.concurrency,
        )
    every = commit_every(run.chunk_rows, in_flight)
    run.model = (
        resolve_model(s, run.consumer) if engine.engine_mode == "engine" else (engine.endpoint_model or "endpoint")
    )
    # before anything imports torch or transformers: they read their cache locations once, at import
    env = prepare_environment(s, device=engine.device if engine.device != "auto" else "cpu", model=run.model)
    _say_what_runs(run)
    with imports_in_background() if engine.engine_mode == "engine" else nullcontext():
        began = time.monotonic()
        init_ray(s, env)
        console.phase(
            f"Ray up ({time.monotonic() - began:.0f} s); the engine starts as rows flow: it loads "
            f"{run.model} and warms up, then answers"
        )
        if run.interrupts is not None:
            run.interrupts.install()  # again: ray.init sets its own SIGTERM handler (sys.exit)
        engine_node_split([run, *also])
        yield every


def _say_what_runs(run: JobRun) -> None:
    p, work = run.plan, run.work
    assert p is not None and work is not None
    console.phase(
        f"run {p.run_id} for {run.consumer.name}: {work.todo:,} rows of {run.consumer.source_table}, model "
        f"{run.model}; " + ("Ray is up (the job lingered)" if run.warm else "starting Ray")
    )


def _build(run: JobRun, every: int) -> BuiltPipeline:
    from icebatch_job.process.runtime import detect_device
    from icebatch_job.stages.pipeline import build_pipeline

    assert run.plan is not None
    run.device = detect_device(run.settings)
    source = run_source(run, every)
    return build_pipeline(
        source.dataset,
        source.task,
        run.settings,
        window=source.window,
        run_id=run.plan.run_id,
        model=run.model,
        device=run.device,
    )


def run_source(run: JobRun, every: int, member: int | None = None) -> RunSource:
    """The rows of ``run`` still to do, as the pipeline reads them, its row window, and its committer (Ray is up)."""
    from icebatch_job.commit.window import RowWindow, blocks_of
    from icebatch_job.plan.source import Failpoint, read_dataset
    from icebatch_job.stages.inputs import RunSource

    s, work, engine = run.settings, run.work, run.settings.engine
    assert work is not None
    window = RowWindow(run.chunk_rows)
    policy = ChunkPolicy(every, s.progress.chunk_seconds, engine.max_inference_error_rate)
    run.committer = _committer(run, policy, window.release)
    source = read_dataset(work.planned, work.skip, fp=Failpoint(s.progress.failpoint, s.home))
    return RunSource(blocks_of(source, engine.batch_size), run.consumer.task, window, member)


def stream(run: JobRun, built: BuiltPipeline) -> None:
    """Stream result rows into chunks, committed as they fill, with progress on stderr.

    If the pipeline fails or a signal stops it, the rows already finished are committed before the
    error goes on (the next attempt does not redo them).
    """
    committer, p = run.committer, run.plan
    assert committer is not None and p is not None
    todo = committer.range_rows - len(committer.done)
    progress = Progress(todo)
    progress.note(f"labelling {todo:,} rows on {run.device}, committed in chunks of {run.chunk_rows:,}")
    run.stage = "inference"
    run.timing.started, run.timing.started_at = time.monotonic(), time.time()
    try:
        with _stall_watch(run) as watch:
            for item in built.dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                table = cast("pa.Table", item)
                watch.arrived(table.num_rows)
                batch = built.parse(table)
                if not run.timing.first_result_seconds:
                    run.timing.first_result(batch, progress)
                progress.advance(batch.num_rows)
                committer.add(batch)
                watch.waiting()
    except (Exception, JobInterrupted) as e:
        run.timing.ended = time.monotonic()
        progress.close()
        drain(run, e)
        raise
    run.timing.ended = time.monotonic()
    progress.close()


def _stall_watch(run: JobRun) -> StallWatch:
    """The watch that stops a run waiting too long for a result (only where a stop can be handled: a run with
    ``interrupts``, in the job's own process or the launcher's main thread; elsewhere it has no limit)."""
    limit = run.settings.progress.stall_seconds if run.interrupts is not None else 0
    return StallWatch(limit, run.interrupts.stop if run.interrupts is not None else lambda _reason: None)


def drain(run: JobRun, error: BaseException) -> None:
    """Commit the finished rows of a stopping attempt, unless committing is what failed."""
    committer = run.committer
    if committer is None or not committer.held or isinstance(error, IcebatchError):
        return
    stage, run.stage = run.stage, "commit"
    try:
        committed = committer.drain()
        log.warning("stopping (%s): committed the %d rows this attempt had finished", type(error).__name__, committed)
    except Exception as e:  # the original error is what the report is about
        log.error("stopping (%s): could not commit the finished rows: %r", type(error).__name__, e)
    finally:
        run.stage = stage  # where the attempt failed, not where it cleaned up


def commit_run(run: JobRun) -> CommitResult:
    """The last chunk, with the watermark (once every row of the range has its result row)."""
    run.stage = "commit"
    assert run.committer is not None
    return run.committer.finish()


def removal_counts(run: JobRun, commit: CommitResult) -> dict[str, int]:
    """What the commit that moved the watermark recorded of rows unchanged and verdicts removed (a range that
    deleted or rewrote rows only: ``plan.work.last_commit``)."""
    if run.work is None or not run.work.planned.rewrites:
        return {}
    table = run.ledger.results()
    snapshot = table.metadata.snapshot_by_id(commit.ledger_snapshot_id) if table is not None else None
    summary = snapshot.summary if snapshot is not None and snapshot.summary is not None else {}

    def number(key: str) -> int:
        value = summary.get(key)
        return int(value) if value is not None and str(value).isdigit() else 0

    removed = number(Key.VERDICTS_GONE) + number(Key.VERDICTS_SUPERSEDED)
    return {"rows_unchanged": number(Key.ROWS_UNCHANGED), "verdicts_removed": removed}


def completed(run: JobRun, commit: CommitResult) -> JobResult:
    """The report on the console, and "Batch Job Completed" on the bus."""
    c = run.committer
    assert run.plan is not None and c is not None
    # the figures the ledger recorded with the run's last commit: the report, `icebatch runs`, `costs` and the budget
    # all read these, so they agree to the cent (measured again here, the seconds since that commit would differ)
    totals = as_recorded(c.recorded or run.totals(c.stats, c.redone), run.settings.billing())
    event = completed_event(
        run.plan,
        totals,
        deployment=run.settings.top.deployment,
        rows_by_status=dict(c.stats.statuses),
        labels=c.stats.label_breakdown(),
        cost=run_cost(totals, run.settings),
        ledger_snapshot_id=commit.ledger_snapshot_id,
        finished_at=datetime.now(UTC),
        chunks=c.chunks,
        row_noun=run.consumer.row_noun,
        **removal_counts(run, commit),
    )
    run.out(completed_text(event, include_state=False, prices=run.settings.cost.batch_prices()))
    publish(run.publisher, event)
    return JobResult(
        "completed",
        plan=run.plan,
        completed=event,
        chunk_commit_seconds=c.commit_seconds,
        timeline=run.timing.timeline(),
        linger=run.linger,
    )


def failed_event(run: JobRun, error: BaseException, *, retryable: bool) -> BatchJobFailed:
    p, c = run.plan, run.committer
    committed = len(c.done) if c else (p.resume.rows_committed if p and p.resume else 0)
    reason = one_line(str(error), 2000) or type(error).__name__
    if isinstance(error, KeyboardInterrupt):
        mine = c.committed if c else 0
        why = str(error) if isinstance(error, JobStalled) else "interrupted (signal)"
        reason = f"{why}: this attempt committed {mine} rows; {committed} of the range are committed"
    totals = run.totals(c.stats, c.redone) if c else None
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
        resumable=p is not None and not isinstance(error, WatermarkConflictError),
        attempt=run.attempt.number,
        rows_processed=c.received if c else 0,
        rows_committed=committed,
        attempt_rows_committed=c.committed if c else 0,
        tokens=TokenCounts(input=totals.input_tokens, output=totals.output_tokens) if totals else None,
        engine_seconds=run.timing.engine_seconds,
        job_seconds=run.elapsed,
        cost=run_cost(totals, run.settings) if totals else None,
        rayjob_name=run.request.rayjob_name,
        started_at=run.started,
        failed_at=datetime.now(UTC),
    )


def publish(publisher: EventPublisher, event: BatchJobCompleted | BatchJobFailed | BatchJobDeferred) -> None:
    try:
        event_id = publisher.publish(event)
        log.info("emitted %r (%s)", event.detail_type, event_id)
    except Exception as e:  # the ledger already holds the truth: the event is not worth failing the run for
        if isinstance(event, BatchJobCompleted):  # reconciliation reports failed jobs only
            then = f"the run is committed: `icebatch report {event.run_id}` rebuilds its report"
        elif isinstance(event, BatchJobDeferred):
            then = "the range's next attempt waits for the next trigger"
        else:
            then = "the nightly reconciliation reports the job if it failed"
        log.error("could not emit %r: %s; %s", event.detail_type, one_line(str(e), 300), then)
