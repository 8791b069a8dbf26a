"""A shared job: several consumers' runs through one engine.

Consumers due at the same time whose model matches run in one job (the launcher groups them; by hand,
``icebatch job run --consumer a --with b``): one node, one image pull, one Ray, one model load, one engine. Each run
keeps all it has alone: its plan and range, its rows' prompts and output schema (each row carries its own sampling
parameters into the engine), its row window, its results table, chunks and watermark commit, its report and event;
exactly once as any run.

A run's failure is its own: one whose plan fails, whose chunk cannot be committed or whose rows fail past
``ICEBATCH_MAX_INFERENCE_ERROR_RATE`` commits what it finished, reports "Batch Job Failed", and its row window is
closed (none of its rows go on to the engine); the job goes on with the others. What stops the engine (a signal, a
stall, the engine failing) stops every run, each committing what it finished.
With an endpoint (``ICEBATCH_ENGINE_MODE=endpoint``) the runs share the job's Ray and its stream to the endpoint.

The node is split by tokens: each run pays its share of the job's lifetime and idle tail (``RunTotals.share``), and
its report says what the other runs paid of the start-up and tail it would have paid alone.

Once every run is committed the job decides, for all its consumers at once, whether to keep its node
(``linger.decide_group``: the rows that landed for each within the longest of their windows, priced as one job; each
run's last commit records the window, of which it pays its share). While it lingers, rows that land for any of its
consumers make a round: a warm run for each consumer (new run ids, from their watermarks), through one engine again,
each exactly once as any run; then the job decides again.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from icebatch.core.bus import EventPublisher, load_publisher
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.errors import ConfigError, IcebatchError, TransientError, WatermarkConflictError
from icebatch.core.failpoints import arm
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch.core.untrusted import one_line

from icebatch_job.columns import MEMBER
from icebatch_job.commit.chunks import Attempt
from icebatch_job.commit.sharing import Sharing
from icebatch_job.job import (
    JobRequest,
    JobResult,
    JobRun,
    before_the_job,
    commit_run,
    completed,
    conflicted,
    decide_linger,
    deferred,
    drain,
    failed_event,
    plan,
    prepare,
    publish,
    run_job,
    run_source,
    start,
    start_ray,
    stream,
    waited_for_rows,
)
from icebatch_job.process.interrupts import Interrupts, JobInterrupted
from icebatch_job.process.stall import StallWatch
from icebatch_job.progress import Progress

if TYPE_CHECKING:
    import pyarrow as pa
    import ray.data

    from icebatch_job.commit.window import RowWindow
    from icebatch_job.stages.parse import ResultParser

log = logging.getLogger(__name__)


def run_request(
    settings: Settings,
    request: JobRequest,
    *,
    publisher: EventPublisher | None = None,
    out: Callable[[str], None] = print,
    interrupts: Interrupts | None = None,
) -> JobResult:
    """The job a request asks for: a shared one when it takes other consumers' runs (``--with``), else ``run_job``."""
    if not request.shared_with:
        return run_job(settings, request, publisher=publisher, out=out, interrupts=interrupts)
    arm(settings.progress.failpoint, settings.home)
    return run_shared(
        settings, request, publisher=publisher or load_publisher(settings), out=out, interrupts=interrupts
    )


def run_shared(
    settings: Settings,
    request: JobRequest,
    *,
    publisher: EventPublisher,
    out: Callable[[str], None],
    interrupts: Interrupts | None,
) -> JobResult:
    """``request``'s run and each of ``request.shared_with``'s, through one engine: the first run's result, the
    others' in its ``shared``."""
    consumers = load_consumers(settings)
    requests = [request, *request.shared_with]
    names = [r.consumer for r in requests]
    if None in names or len(set(names)) != len(names):
        raise ConfigError("a shared job names each of its consumers once: --consumer NAME --with OTHER ...")
    runs, before = [], before_the_job(settings)
    for r in requests:
        consumer = consumer_named(consumers, r.consumer)
        ledger = open_ledger(settings, consumer)
        runs.append(JobRun(settings, consumer, r, publisher, out, ledger, interrupts, before_job=before))
    models = {c.model_source(settings) for c in (run.consumer for run in runs)}
    if len(models) > 1 and settings.engine.engine_mode == "engine":
        raise ConfigError(
            f"consumers {', '.join(str(n) for n in names)} use different models ({', '.join(map(str, models))}): "
            "only consumers of one model share a job; run them in jobs of their own"
        )
    first = _round(runs)
    first.linger = runs[0].linger
    if _all_done(first):  # a run that failed (or lost its range) ends the job, as it ends a job alone
        first.lingered = _linger(runs)
    return first


def _all_done(result: JobResult) -> bool:
    return all(r.status in ("completed", "nothing_new") for r in (result, *result.shared))


def _round(runs: list[JobRun]) -> JobResult:
    """The runs through one engine (those with rows for the model), each committed, the job's linger decided before
    their last commits: the first run's result, the others' in its ``shared``."""
    settings = runs[0].settings
    results: dict[int, JobResult] = {}
    for i, run in enumerate(runs):
        if (result := isolated(run, _before_engine)) is not None:
            results[i] = result
    waiting = [i for i in range(len(runs)) if i not in results]
    if waiting and settings.top.job_engine == "off":
        results.update({i: settled(runs[i], deferred) for i in waiting})
    elif len(waiting) == 1:
        results[waiting[0]] = settled(runs[waiting[0]], lambda run: _alone(run, runs))  # nothing to share
    elif waiting:
        results.update(_through_one_engine([runs[i] for i in waiting], waiting, runs))
    elif runs[0].warm:  # a round taken while lingering that needed no engine (rows deleted): the job goes on waiting
        _keep_node(runs)
    first = results[0]
    first.shared = [results[i] for i in range(1, len(runs))]
    return first


def _keep_node(group: list[JobRun]) -> None:
    """Whether the job keeps its node once this round is committed, for all its consumers (``decide_linger``); each
    run's last commit records it (a run that was not taken warm pays its share of the window)."""
    window = decide_linger(group[0], group)
    for run in group:
        run.linger = window


def _linger(runs: list[JobRun]) -> list[JobResult]:
    """Keep the node while rows land for any of the job's consumers: each time, a round of warm runs (``_round``), till
    a window passes with none, a signal stops the job, a run fails, or the rows no longer pay for the node."""
    names = ", ".join(run.consumer.name for run in runs)
    rounds: list[JobResult] = []
    current = runs
    while (window := current[0].linger) is not None and window.keeps:
        drained, drained_at = time.monotonic(), datetime.now(UTC)
        if not waited_for_rows([run.ledger for run in current], window, names, runs[0].out):
            break
        current = [_warm(run, drained, drained_at) for run in runs]
        result = _round(current)
        rounds.append(result)
        if not _all_done(result):
            break
    return rounds


def _warm(run: JobRun, drained: float, drained_at: datetime) -> JobRun:
    """The consumer's next run in a lingering job: from its watermark, its time from the commit before it (the wait)."""
    request = JobRequest(rayjob_name=run.request.rayjob_name, consumer=run.consumer.name, linger=run.request.linger)
    warm = JobRun(
        run.settings,
        run.consumer,
        request,
        run.publisher,
        run.out,
        run.ledger,
        run.interrupts,
        started=drained_at,
        attempt=Attempt(1, secrets.token_hex(4), drained),
    )
    warm.warm, warm.job_started = True, run.job_started
    return warm


def isolated(run: JobRun, step: Callable[[JobRun], JobResult | None]) -> JobResult | None:
    """``step`` for one run of a shared job: its failure is reported and returned (the job goes on with the others);
    a signal stops the job (reported for this run, and raised)."""
    try:
        return step(run)
    except WatermarkConflictError as e:
        return conflicted(run, e)
    except Exception as e:
        return _failed(run, e)
    except BaseException as e:
        publish(run.publisher, failed_event(run, e, retryable=True))
        raise


def settled(run: JobRun, step: Callable[[JobRun], JobResult]) -> JobResult:
    """``isolated`` for a step that always ends in a result."""
    result = isolated(run, step)
    assert result is not None
    return result


def _failed(run: JobRun, error: Exception) -> JobResult:
    event = failed_event(
        run, error, retryable=not isinstance(error, IcebatchError) or isinstance(error, TransientError)
    )
    publish(run.publisher, event)
    log.error("run %s of the shared job failed (%s); the others go on", run.consumer.name, one_line(str(error), 300))
    run.out(f"{run.consumer.name}: failed ({type(error).__name__}): {one_line(str(error), 300)}")
    return JobResult("failed", plan=run.plan, failed=event)


def _before_engine(run: JobRun) -> JobResult | None:
    """Plan and prepare ``run``: its result when it needs no engine, None when it does."""
    if not plan(run):
        return JobResult("nothing_new")
    if prepare(run):
        return None
    return completed(run, commit_run(run))


def _alone(run: JobRun, group: list[JobRun]) -> JobResult:
    stream(run, start(run))
    _keep_node(group)
    return completed(run, commit_run(run))


def _through_one_engine(runs: list[JobRun], members: list[int], group: list[JobRun]) -> dict[int, JobResult]:
    """The runs' rows through one pipeline and one engine, each run's answers to its own committer; then each run's
    last commit and report (their shares of the node are known once every answer is in)."""
    from icebatch_job.process.runtime import detect_device
    from icebatch_job.stages.parse import ResultParser
    from icebatch_job.stages.pipeline import build_shared_pipeline

    first, sharing = runs[0], Sharing([run.consumer.name for run in runs])
    for run in runs:
        run.sharing, run.timing, run.job_started = sharing, first.timing, first.job_started
    results: dict[int, JobResult] = {}
    try:
        with start_ray(first, also=runs[1:]) as every:
            first.device = detect_device(first.settings)
            for run in runs[1:]:
                run.stage, run.chunk_rows, run.model, run.device = "start", first.chunk_rows, first.model, first.device
            sources = [run_source(run, every, member) for run, member in zip(runs, members, strict=True)]
            dataset, model = build_shared_pipeline(sources, first.settings, model=first.model, device=first.device)
            if first.interrupts is not None:
                first.interrupts.install()  # again: Ray Data LLM's processor build calls ray.init once more
    except BaseException as e:
        for run in runs:
            results[members[runs.index(run)]] = _stopped(run, e)
        if not isinstance(e, Exception):
            raise
        return results
    for run in runs:
        run.model = model
    windows = {m: cast("RowWindow", s.window) for m, s in zip(members, sources, strict=True)}
    live = dict(zip(members, runs, strict=True))
    parsers = {m: ResultParser(r.consumer.task, r.plan.run_id if r.plan else "", model) for m, r in live.items()}
    try:
        _stream(dataset, live, parsers, windows, results)
    except BaseException as e:
        for member, run in live.items():
            drain(run, e)
            results[member] = _stopped(run, e)
        if not isinstance(e, Exception):
            raise
        return results
    _keep_node(group)
    for member, run in live.items():
        results[member] = settled(run, _last_commit)
    return results


def _last_commit(run: JobRun) -> JobResult:
    return completed(run, commit_run(run))


def _stopped(run: JobRun, error: BaseException) -> JobResult:
    """What stopped the engine stops ``run`` too: reported as the run's failure."""
    retryable = not isinstance(error, IcebatchError) or isinstance(error, TransientError)
    event = failed_event(run, error, retryable=retryable)
    publish(run.publisher, event)
    return JobResult("failed", plan=run.plan, failed=event)


def _stream(
    dataset: ray.data.Dataset,
    live: dict[int, JobRun],
    parsers: dict[int, ResultParser],
    windows: dict[int, RowWindow],
    results: dict[int, JobResult],
) -> None:
    """The engine's answers, each batch split by run (``columns.MEMBER``) into its committer; a run whose committer
    fails leaves ``live`` (its finished rows committed, its failure reported in ``results``, its window closed)."""
    import pyarrow.compute as pc

    first = next(iter(live.values()))
    todo = sum(r.committer.range_rows - len(r.committer.done) for r in live.values() if r.committer is not None)
    progress = Progress(todo)
    names = ", ".join(r.consumer.name for r in live.values())
    progress.note(f"labelling {todo:,} rows of {names} through one engine on {first.device}")
    for run in live.values():
        run.stage = "inference"
    timing = first.timing
    timing.started, timing.started_at = time.monotonic(), time.time()
    limit = first.settings.progress.stall_seconds if first.interrupts is not None else 0
    try:
        with StallWatch(limit, first.interrupts.stop if first.interrupts else lambda _reason: None) as watch:
            for item in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                table = cast("pa.Table", item)
                watch.arrived(table.num_rows)
                column = table.column(MEMBER)
                for member in pc.unique(column).to_pylist():
                    part = table.filter(pc.equal(column, member))
                    if member not in live:  # its run failed: its rows in flight are let go
                        windows[member].release(part.num_rows)
                        continue
                    run = live[member]
                    try:
                        batch = parsers[member](part)
                        if not timing.first_result_seconds:
                            timing.first_result(batch, progress)
                        assert run.committer is not None and run.sharing is not None
                        run.sharing.received(run.consumer.name, batch)
                        run.committer.add(batch)
                    except Exception as e:
                        del live[member]
                        windows[member].close()
                        drain(run, e)
                        results[member] = (
                            conflicted(run, e) if isinstance(e, WatermarkConflictError) else _failed(run, e)
                        )
                progress.advance(table.num_rows)
                watch.waiting()
    except (Exception, JobInterrupted):
        timing.ended = time.monotonic()
        progress.close()
        raise
    timing.ended = time.monotonic()
    progress.close()
