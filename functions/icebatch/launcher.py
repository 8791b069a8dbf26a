"""One launch decision: read metadata, decide, and submit (or not), leaving a record of why.

The launcher never reads data files and never writes a table: the backlog comes from snapshot
metadata (``icebatch.ledger``), the decision from ``icebatch.gate.decide``, the RayJob from
``icebatch.rayjob``. Every call returns one ``LaunchDecision``, which the handler logs and returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict

from icebatch.backends import JobBackend
from icebatch.bus import EventPublisher
from icebatch.events import BatchJobSubmitted, SnapshotRange
from icebatch.gate import Decision, GateInput, decide
from icebatch.ledger import Backlog, ResultsLedger, new_run_id
from icebatch.rayjob import JobSpec, JobState, build_rayjob_manifest, gpus_for, job_name, watermark_tag
from icebatch.settings import Settings
from icebatch.triggers import Trigger, relevance

log = logging.getLogger(__name__)


class LaunchDecision(BaseModel):
    """The structured record of one launcher invocation."""

    model_config = ConfigDict(frozen=True)

    trigger: str
    origin: str
    event_id: str | None
    table: str
    consumer: str
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

    def response(self) -> dict[str, Any]:
        return {"decision": self.decision.model_dump(mode="json"), "manifest": self.manifest}


def attempts_from(jobs: list[JobState], watermark: int | None) -> tuple[int, int, JobState | None]:
    """(next attempt number, failed attempts, active job) for launches from this watermark."""
    tag = watermark_tag(watermark)
    same = [j for j in jobs if j.from_tag == tag]
    active = next((j for j in jobs if not j.terminal), None)
    failed = sum(1 for j in same if j.failed)
    last = max((j.attempt for j in same), default=0)
    return last + 1, failed, active


def launch(
    trigger: Trigger,
    settings: Settings,
    *,
    ledger: ResultsLedger,
    backend: JobBackend,
    publisher: EventPublisher | None = None,
    now: datetime | None = None,
) -> LaunchOutcome:
    now = now or datetime.now(UTC)
    ignore = relevance(trigger, settings.source_table, None) if trigger.origin == "glue" else None
    backlog: Backlog | None = None
    if ignore is None:
        source = ledger.source()
        if trigger.origin == "s3":
            ignore = relevance(trigger, settings.source_table, source.metadata.location)
        if ignore is None:
            backlog = ledger.backlog(source=source)
    jobs = backend.list_jobs(settings.consumer) if backlog is not None and backlog.rows > 0 else []
    watermark = backlog.watermark_snapshot_id if backlog else None
    attempt, failed, active = attempts_from(jobs, watermark)
    name = job_name(settings.consumer, watermark, attempt)
    dry_run = trigger.dry_run or settings.dry_run
    age = backlog.oldest_pending_age_seconds(int(now.timestamp() * 1000)) if backlog else None
    gate = decide(
        GateInput(
            kind=trigger.kind,
            force=trigger.force,
            dry_run=dry_run,
            backlog_rows=backlog.rows if backlog else 0,
            oldest_age_seconds=age,
            threshold=settings.backlog_threshold,
            max_staleness_seconds=settings.max_staleness_seconds,
            active_job=active.name if active else None,
            failed_attempts=failed,
            max_attempts=settings.max_attempts,
            ignore_reason=ignore,
        )
    )
    decision, reason = gate.decision, gate.reason
    if active is not None and decision == "skip" and active.from_tag == watermark_tag(watermark):
        decision, reason = "already_launched", f"{active.name} is already running for this range"

    manifest = spec = submission = None
    if decision in ("launch", "dry_run") and backlog is not None and backlog.current_snapshot_id is not None:
        spec = JobSpec(
            name=name,
            run_id=new_run_id(settings.consumer, now),
            consumer=settings.consumer,
            source_table=settings.source_table,
            from_snapshot=watermark,
            to_snapshot=backlog.current_snapshot_id,
            backlog_rows=backlog.rows,
            gpus=gpus_for(backlog.rows, settings) if settings.backend == "kuberay" else 1,
            attempt=attempt,
            trigger=f"{trigger.kind}/{trigger.origin}",
        )
        manifest = build_rayjob_manifest(settings, spec)
        if decision == "launch":
            result = backend.submit(manifest, spec)
            submission = result.detail
            if not result.created:
                decision, reason = "already_launched", f"{name} already exists ({result.detail})"
            else:
                if publisher is not None:
                    _announce(publisher, spec, settings, trigger, now)
                submission = backend.start(spec) or submission

    record = LaunchDecision(
        trigger=trigger.kind,
        origin=trigger.origin,
        event_id=trigger.event_id,
        table=settings.source_table,
        consumer=settings.consumer,
        watermark_snapshot_id=watermark,
        current_snapshot_id=backlog.current_snapshot_id if backlog else None,
        backlog_rows=backlog.rows if backlog else 0,
        backlog_snapshots=backlog.snapshots if backlog else 0,
        oldest_unprocessed_age_seconds=None if age is None else round(age, 3),
        skipped_rows=backlog.skipped_rows if backlog else 0,
        threshold=settings.backlog_threshold,
        max_staleness_seconds=settings.max_staleness_seconds,
        active_job=active.name if active else None,
        decision=decision,
        reason=reason,
        backend=settings.backend,
        job_name=spec.name if spec else None,
        run_id=spec.run_id if spec else None,
        gpus=spec.gpus if spec else None,
        attempt=spec.attempt if spec else None,
        submission=submission,
        decided_at=now,
    )
    return LaunchOutcome(record, manifest)


def _announce(publisher: EventPublisher, spec: JobSpec, settings: Settings, trigger: Trigger, now: datetime) -> None:
    event = BatchJobSubmitted(
        job_name=spec.name,
        consumer=spec.consumer,
        source_table=spec.source_table,
        range=SnapshotRange(from_exclusive=spec.from_snapshot, to_inclusive=spec.to_snapshot),
        backlog_rows=spec.backlog_rows,
        gpus=spec.gpus,
        backend=settings.backend,
        trigger=f"{trigger.kind}/{trigger.origin}",
        submitted_at=now,
    )
    try:
        publisher.publish(event)
    except Exception as e:  # the job exists; a lost announcement is not worth failing the launch for
        log.warning("could not publish %r: %r", event.detail_type, e)
