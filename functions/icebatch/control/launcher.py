"""One launcher invocation: for every consumer the event concerns, observe, decide, and launch (or not).

The launcher never reads data files and never writes a table: the backlog comes from snapshot metadata
(``icebatch.core.ledger``), the decision from ``icebatch.control.gate.decide``, the RayJob from
``icebatch.control.rayjob``. Each consumer gets one ``LaunchDecision``, which the handler logs and
returns. Per consumer, the steps are:

1. ``observe``: is the event about its table; its backlog (and a run part way through, which is resumed:
   same run id, same pinned range, the next attempt); its jobs; the run's estimate and today's spend;
2. ``decide``: the gate;
3. ``build``: the job's spec and manifest (also for a dry run);
4. ``submit``: create the job (409: already launched) and announce it.

Consumers that launch at once with the engine and one model share a job (``sharing``; ``ICEBATCH_SHARE_JOBS``): one
node, one model load, one engine for their runs (``icebatch_job.shared``), each its own range, results and report.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict

from icebatch.control.backends import JobBackend
from icebatch.control.failure_records import failures_on_record
from icebatch.control.gate import (
    ActiveJob,
    Decision,
    GateInput,
    GateResult,
    Refusal,
    decide,
    gated,
    staleness_lead,
)
from icebatch.control.jobs import JobState, members
from icebatch.control.model_files import model_problem
from icebatch.control.rayjob import JobSpec, build_rayjob_manifest, job_name, range_tag
from icebatch.control.triggers import Trigger, relevance
from icebatch.core.bus import EventPublisher
from icebatch.core.consumers import MAX_JOB_CONSUMER_BYTES, Consumer, job_consumers_json
from icebatch.core.costs.estimate import CostCheck, Estimate, cost_check, estimate_run, spent_on, start_of
from icebatch.core.costs.lease import Member, shared_prices
from icebatch.core.errors import InvalidEventError, InvalidTaskError, SourceReplacedError
from icebatch.core.events import MAX_SHARED, BatchJobSubmitted, SnapshotRange
from icebatch.core.ledger import Backlog, Pending, ResultsLedger, RunRecord, new_run_id
from icebatch.core.settings import Settings

log = logging.getLogger(__name__)


class LaunchDecision(BaseModel):
    """The structured record of one consumer's launch decision."""

    model_config = ConfigDict(frozen=True)

    deployment: str
    trigger: str
    origin: str
    event_id: str | None
    table: str
    consumer: str
    task: str
    task_version: int
    watermark_snapshot_id: int | None
    current_snapshot_id: int | None
    backlog_rows: int
    backlog_snapshots: int
    oldest_unprocessed_age_seconds: float | None
    skipped_rows: int
    threshold: int
    max_staleness_seconds: int
    active_job: str | None
    decision: Decision
    reason: str
    over_budget: bool = False
    estimate_usd: float | None = None
    # the cost gate: the run's $ per 1k rows (start-up and idle tail included), the consumer's ceiling, what it is,
    # and how many rows in all would make a run pay (null: none would; all null: the consumer has no cost gate)
    usd_per_1k_rows: float | None = None
    ceiling_usd_per_1k_rows: float | None = None
    ceiling_basis: str | None = None
    rows_to_pay: int | None = None
    spent_today_usd: float | None = None  # today's (UTC) spend so far, read when the consumer had work
    max_usd_per_day: float | None = None  # the consumer's daily budget
    backend: str
    job_name: str | None = None
    run_id: str | None = None
    gpus: int | None = None
    attempt: int | None = None
    submission: str | None = None
    decided_at: AwareDatetime


@dataclass(frozen=True)
class LaunchOutcome:
    decision: LaunchDecision
    manifest: dict[str, Any] | None


@dataclass
class Context:
    """What one invocation works with, shared by its consumers."""

    settings: Settings
    catalog: Any
    backend: JobBackend
    publisher: EventPublisher | None
    now: datetime
    _jobs: list[JobState] | None = field(default=None, repr=False)

    def jobs(self, consumer: str) -> list[JobState]:
        if self._jobs is None:  # one API call per invocation, and only when some consumer has work
            self._jobs = self.backend.list_jobs(self.settings.top.deployment)
        return [j for job in self._jobs for j in members(job) if j.consumer == consumer]


@dataclass(frozen=True)
class Observation:
    ignore: str | None = None
    refusal: Refusal | None = None
    backlog: Backlog | None = None
    age_seconds: float | None = None
    tag: str = ""
    attempt: int = 1
    failed_attempts: int = 0
    active: ActiveJob | None = None
    estimate: Estimate | None = None
    cost: CostCheck | None = None  # the run's price against the consumer's ceiling (new rows only)
    spent_today: float | None = None  # what the consumer's runs committed today cost (read when it has work)
    pending: Pending | None = None  # a run part way through its range: the launch resumes it
    deferred: bool = False  # the range's last attempt had no model and found rows that need it
    runs: Sequence[RunRecord] = ()  # the consumer's committed runs (what its estimate learns from)
    priced_with: str | None = None  # the consumers its cost gate priced its run with (one shared job)


def launch(
    trigger: Trigger,
    settings: Settings,
    consumers: list[Consumer],
    *,
    catalog: Any,
    backend: JobBackend,
    publisher: EventPublisher | None = None,
    now: datetime | None = None,
) -> list[LaunchOutcome]:
    """One decision per consumer the trigger is for (all of them, unless a manual invoke names one)."""
    selected = [c for c in consumers if trigger.consumer in (None, c.name)]
    if not selected:
        known = ", ".join(c.name for c in consumers)
        raise InvalidEventError(f"no consumer named {str(trigger.consumer)[:40]!r} (known: {known})")
    ctx = Context(settings, catalog, backend, publisher, now or datetime.now(UTC))
    decided = decide_together(trigger, selected, {c.name: observe(trigger, c, ctx) for c in selected}, ctx)
    outcomes: dict[str, LaunchOutcome] = {}
    for group in sharing(decided, settings):
        outcomes.update(launch_group(trigger, group, ctx))
    return [outcomes[consumer.name] for consumer in selected]


@dataclass(frozen=True)
class Decided:
    """One consumer's decision, before its job (if any) is submitted."""

    consumer: Consumer
    seen: Observation
    gate: GateResult
    spec: JobSpec | None


def priced_together(
    consumers: list[Consumer], seen: dict[str, Observation], settings: Settings
) -> dict[str, Observation]:
    """Each consumer with a cost gate and new rows, priced with the others of its model that would share its job
    (``lease.shared_prices``: one start-up and tail for their rows together), as ``bench.day``'s sharing prices them."""
    waiting = [c for c in consumers if (o := seen[c.name]).cost is not None and o.active is None and o.backlog]
    members = [Member(c, seen[c.name].backlog.rows, seen[c.name].runs) for c in waiting]  # type: ignore[union-attr]
    priced = dict(seen)
    for name, (check, others) in shared_prices(members, settings).items():
        priced[name] = replace(seen[name], cost=check, priced_with=", ".join(others))
    return priced


def decide_together(
    trigger: Trigger, consumers: list[Consumer], observed: dict[str, Observation], ctx: Context
) -> list[Decided]:
    """Each consumer's decision, those that would share a job priced together (``priced_together``). A consumer priced
    with others that does not launch (its gate waits, its budget refuses) leaves the group, and the others are priced
    again without its rows, until every group priced is the job that would run."""
    final: dict[str, Decided] = {}
    pool = list(consumers)
    while True:
        seen = priced_together(pool, observed, ctx.settings)
        decided = {c.name: decide_consumer(trigger, c, seen[c.name], ctx) for c in pool}
        left = {n for n, d in decided.items() if d.seen.priced_with and d.gate.decision not in ("launch", "dry_run")}
        final.update(decided)
        if not left:
            return [final[c.name] for c in consumers]
        pool = [c for c in pool if c.name not in left]


def decide_consumer(trigger: Trigger, consumer: Consumer, seen: Observation, ctx: Context) -> Decided:
    given = gate_input(trigger, consumer, seen, ctx)
    gate = decide(given)
    if seen.priced_with and gated(given) and gate.decision in ("launch", "dry_run", "wait"):
        gate = replace(gate, reason=f"{gate.reason} (priced with {seen.priced_with}'s rows: one job)")
    spec = None
    if gate.decision in ("launch", "dry_run") and seen.backlog is not None:
        spec = job_spec(trigger, consumer, seen, ctx)
    return Decided(consumer, seen, gate, spec)


def sharing(decided: list[Decided], settings: Settings) -> list[list[Decided]]:
    """The jobs to submit: consumers that launch now with the engine and one model share a job (``ICEBATCH_SHARE_JOBS``;
    ``icebatch_job.shared``), as many as one job's consumer list holds; every other consumer is a group of its own."""
    groups: list[list[Decided]] = []
    open_groups: dict[tuple[str, str | None], list[Decided]] = {}
    for d in decided:
        key = (d.gate.decision, d.consumer.model_source(settings))
        group = open_groups.get(key) if _can_share(d, settings) else None
        if group is not None and len(group) <= MAX_SHARED and _travels([*group, d]):
            group.append(d)
            continue
        groups.append([d])
        if _can_share(d, settings):
            open_groups[key] = groups[-1]
    return groups


def _can_share(d: Decided, settings: Settings) -> bool:
    """A launch that starts the engine (a run with no GPU removes verdicts only) of a deployment that shares jobs."""
    engine = settings.engine.engine_mode == "engine" and (
        settings.top.backend != "kuberay" or bool(d.spec and d.spec.gpus)
    )
    return settings.launch.share_jobs and d.spec is not None and d.gate.decision in ("launch", "dry_run") and engine


def _travels(group: list[Decided]) -> bool:
    """Whether the group's consumers fit in the environment variable that hands them to the job."""
    return len(job_consumers_json([d.consumer for d in group]).encode()) <= MAX_JOB_CONSUMER_BYTES


def launch_group(trigger: Trigger, group: list[Decided], ctx: Context) -> dict[str, LaunchOutcome]:
    """Submit the group's job (one consumer's, or a shared one named for the first) and record each decision."""
    first, others = group[0], group[1:]
    spec = manifest = submission = None
    gate = first.gate
    if first.spec is not None:
        spec = replace(first.spec, riders=tuple(replace(d.spec, name=first.spec.name) for d in others if d.spec))
        manifest = build_rayjob_manifest(ctx.settings, spec)
        if gate.decision == "launch":
            gate, submission = submit(trigger, spec, manifest, gate, ctx)
    decision = record(trigger, first.consumer, first.seen, _shared(gate, others), spec, submission, ctx)
    outcomes = {first.consumer.name: LaunchOutcome(decision, manifest)}
    for d in others:
        assert spec is not None and d.spec is not None
        # the job's fate is each rider's: launched with it, or already launched (another launcher's 409)
        same = gate.decision == d.gate.decision
        joined = replace(gate, reason=f"{d.gate.reason}; in {first.consumer.name}'s job" if same else gate.reason)
        rider = replace(d.spec, name=spec.name)
        # the job that runs its run: the same manifest (submitted once)
        outcomes[d.consumer.name] = LaunchOutcome(
            record(trigger, d.consumer, d.seen, joined, rider, submission, ctx), manifest
        )
    return outcomes


def _shared(gate: GateResult, others: list[Decided]) -> GateResult:
    if not others:
        return gate
    return replace(
        gate, reason=f"{gate.reason}; one job with {', '.join(d.consumer.name for d in others)} (one engine)"
    )


def observe(trigger: Trigger, consumer: Consumer, ctx: Context) -> Observation:
    """What the decision needs, from metadata and the backend only."""
    ledger = ResultsLedger(ctx.catalog, consumer)
    if trigger.origin == "glue" and (why := relevance(trigger, consumer.source_table, None)):
        return Observation(ignore=why)
    source = ledger.source()
    if trigger.origin == "s3" and (why := relevance(trigger, consumer.source_table, source.metadata.location)):
        return Observation(ignore=why)
    progress = ledger.progress()
    watermark, pending = progress.watermark, progress.pending
    if pending is not None and ledger.end_expired(pending, source):
        pending = None  # its range's end was expired: the job closes it and a new run takes the rest
    try:
        backlog = ledger.backlog(source=source, watermark=watermark)
    except SourceReplacedError as e:
        return Observation(refusal=Refusal("source_replaced", str(e)))
    except InvalidTaskError as e:
        return Observation(refusal=Refusal("invalid_task", str(e)))
    age = backlog.oldest_pending_age_seconds(int(ctx.now.timestamp() * 1000))
    tag = range_tag(ctx.settings.top.deployment, consumer.name, consumer.task_version, watermark.source_snapshot_id)
    removals_only = sum(_without_new_rows(backlog, consumer)) > 0  # rows deleted or rewritten, none added
    if backlog.rows <= 0 and not removals_only:
        return Observation(backlog=backlog, age_seconds=age, tag=tag)
    jobs = [_ended(j) if j.name == trigger.ended_job else j for j in ctx.jobs(consumer.name)]
    same = [j for j in jobs if j.from_tag == tag]
    # a removals-only range's first attempt has no model (no GPU on kuberay); one that found rows the model must
    # see (a copy-on-write UPDATE changed them) ended "deferred" without moving the watermark: the next one has it
    deferred = removals_only and any(j.succeeded for j in same)
    needs_model = not removals_only or deferred
    if needs_model and (problem := model_problem(consumer, ctx.settings)):  # before a GPU node is bought
        return Observation(refusal=Refusal("invalid_task", problem))
    active = next((j for j in jobs if not j.terminal), None)
    runs = ledger.runs()
    rows = pending.rows_remaining if pending else backlog.rows if not removals_only else backlog.skipped_rows
    return Observation(
        backlog=backlog,
        age_seconds=age,
        tag=tag,
        attempt=max((j.attempt for j in same), default=0) + 1,
        failed_attempts=sum(1 for j in same if j.failed),
        active=ActiveJob(active.name, active.from_tag == tag) if active else None,
        estimate=estimate_run(max(rows, 1), consumer, runs, ctx.settings) if needs_model else None,
        cost=cost_check(rows, consumer, runs, ctx.settings) if pending is None and not removals_only else None,
        spent_today=spent_on(
            ctx.now, runs, ctx.settings, failures_on_record(ctx.settings, [consumer.name], since=start_of(ctx.now))
        ),
        pending=pending,
        deferred=deferred,
        runs=runs,
    )


def _ended(job: JobState) -> JobState:
    """A job whose own event says it ended deferred (its RayJob's status may lag): it succeeded."""
    return replace(job, deployment_status="Complete", job_status="SUCCEEDED")


def gate_input(trigger: Trigger, consumer: Consumer, seen: Observation, ctx: Context) -> GateInput:
    budget = consumer.budget
    return GateInput(
        kind=trigger.kind,
        force=trigger.force,
        dry_run=trigger.dry_run or ctx.settings.launch.dry_run,
        backlog_rows=seen.backlog.rows if seen.backlog else 0,
        oldest_age_seconds=seen.age_seconds,
        threshold=consumer.backlog_threshold,
        max_staleness_seconds=consumer.max_staleness_seconds,
        active_job=seen.active,
        failed_attempts=seen.failed_attempts,
        max_attempts=ctx.settings.launch.max_attempts,
        estimate_usd=seen.estimate.usd if seen.estimate else 0.0,
        max_usd_per_run=budget.max_usd_per_run if budget else None,
        spent_today_usd=seen.spent_today or 0.0,
        max_usd_per_day=budget.max_usd_per_day if budget else None,
        ignore_reason=seen.ignore,
        refusal=seen.refusal,
        resume=seen.pending.describe() if seen.pending else None,
        removals=_without_new_rows(seen.backlog, consumer)[0],
        rewritten=_without_new_rows(seen.backlog, consumer)[1],
        deferred=seen.deferred,
        cost=seen.cost,
        lead_seconds=(
            staleness_lead(seen.estimate.first_commit_seconds, seen.age_seconds, seen.backlog.snapshots)
            if seen.estimate and seen.cost and seen.backlog
            else 0.0
        ),
    )


def _without_new_rows(backlog: Backlog | None, consumer: Consumer) -> tuple[int, int]:
    """(deleted, rewritten) since the watermark when no row was added: rows whose verdicts a run removes (none with
    ``on_delete: keep``; one at least for a delete no summary counted) and rows rewritten copy-on-write (copies and
    changed rows, matched by content). (0, 0) when rows were added or nothing was deleted or rewritten."""
    if backlog is None or backlog.rows > 0 or not backlog.rewrites:
        return 0, 0
    rewritten = backlog.skipped_rows
    deleted = 0 if consumer.on_delete == "keep" else max(backlog.deleted_rows, 0 if rewritten else 1)
    return deleted, rewritten


def job_spec(trigger: Trigger, consumer: Consumer, seen: Observation, ctx: Context) -> JobSpec:
    """A new run over the backlog, or the next attempt of the run part way through (same run, same range).
    A run over rows deleted or rewritten, none added, gets no GPU worker on kuberay (``gpus`` 0: the job runs on
    the head, with no model) unless its range's last attempt found rows that need the model (``deferred``)."""
    assert seen.backlog is not None and seen.backlog.current_snapshot_id is not None
    kuberay = ctx.settings.top.backend == "kuberay"
    gpus = seen.estimate.gpus if seen.estimate and kuberay else 0 if kuberay else 1
    p = seen.pending
    return JobSpec(
        name=job_name(consumer.name, seen.tag, seen.attempt),
        run_id=p.run_id if p else new_run_id(consumer.name, ctx.now),
        deployment=ctx.settings.top.deployment,
        consumer=consumer,
        tag=seen.tag,
        from_snapshot=seen.backlog.watermark_snapshot_id,
        to_snapshot=p.to_snapshot_inclusive if p else seen.backlog.current_snapshot_id,
        backlog_rows=p.rows_remaining if p else seen.backlog.rows,
        gpus=gpus,
        attempt=seen.attempt,
        trigger=f"{trigger.kind}/{trigger.origin}",
        launched_at=ctx.now.timestamp(),
    )


def submit(
    trigger: Trigger, spec: JobSpec, manifest: dict[str, Any], gate: GateResult, ctx: Context
) -> tuple[GateResult, str]:
    """Create the job; a 409 means another launcher created it first: "already launched"."""
    result = ctx.backend.submit(manifest, spec)
    if not result.created:
        return GateResult("already_launched", f"{spec.name} already exists ({result.detail})"), result.detail
    if ctx.publisher is not None:
        for each in (spec, *spec.riders):
            announce(ctx.publisher, each, ctx)
    return gate, ctx.backend.start(spec) or result.detail


def announce(publisher: EventPublisher, spec: JobSpec, ctx: Context) -> None:
    event = BatchJobSubmitted(
        deployment=spec.deployment,
        job_name=spec.name,
        consumer=spec.consumer.name,
        source_table=spec.consumer.source_table,
        range=SnapshotRange(from_exclusive=spec.from_snapshot, to_inclusive=spec.to_snapshot),
        backlog_rows=spec.backlog_rows,
        gpus=spec.gpus,
        backend=ctx.settings.top.backend,
        trigger=spec.trigger,
        submitted_at=ctx.now,
    )
    try:
        publisher.publish(event)
    except Exception as e:  # the job exists; a lost announcement is not worth failing the launch for
        log.warning("could not publish %r: %r", event.detail_type, e)


def record(
    trigger: Trigger,
    consumer: Consumer,
    seen: Observation,
    gate: GateResult,
    spec: JobSpec | None,
    submission: str | None,
    ctx: Context,
) -> LaunchDecision:
    b = seen.backlog
    return LaunchDecision(
        deployment=ctx.settings.top.deployment,
        trigger=trigger.kind,
        origin=trigger.origin,
        event_id=trigger.event_id,
        table=consumer.source_table,
        consumer=consumer.name,
        task=consumer.task.name,
        task_version=consumer.task_version,
        watermark_snapshot_id=b.watermark_snapshot_id if b else None,
        current_snapshot_id=b.current_snapshot_id if b else None,
        backlog_rows=b.rows if b else 0,
        backlog_snapshots=b.snapshots if b else 0,
        oldest_unprocessed_age_seconds=None if seen.age_seconds is None else round(seen.age_seconds, 3),
        skipped_rows=b.skipped_rows if b else 0,
        threshold=consumer.backlog_threshold,
        max_staleness_seconds=consumer.max_staleness_seconds,
        active_job=seen.active.name if seen.active else None,
        decision=gate.decision,
        reason=gate.reason,
        over_budget=gate.over_budget,
        estimate_usd=round(seen.estimate.usd, 4) if seen.estimate else None,
        usd_per_1k_rows=round(seen.cost.usd_per_1k_rows, 6) if seen.cost else None,
        ceiling_usd_per_1k_rows=round(seen.cost.ceiling.usd_per_1k_rows, 6) if seen.cost else None,
        ceiling_basis=seen.cost.ceiling.basis if seen.cost else None,
        rows_to_pay=seen.cost.rows_to_pay if seen.cost else None,
        spent_today_usd=None if seen.spent_today is None else round(seen.spent_today, 6),
        max_usd_per_day=consumer.budget.max_usd_per_day if consumer.budget else None,
        backend=ctx.settings.top.backend,
        job_name=spec.name if spec else None,
        run_id=spec.run_id if spec else None,
        gpus=spec.gpus if spec else None,
        attempt=spec.attempt if spec else None,
        submission=submission,
        decided_at=ctx.now,
    )
