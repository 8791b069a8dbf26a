"""Reconciliation: jobs that ended without saying so get reported, and finished jobs do not pile up.

A job that is killed (activeDeadlineSeconds, OOM, a failed submitter pod, a lost node) cannot emit its
own "Batch Job Failed". On every nightly schedule the launcher lists this consumer's jobs and, for each
terminal job not yet marked ``icebatch.io/reported``:

- failed and its run id is not in the ledger -> emit "Batch Job Failed" (``origin: reconciler``);
- then mark it reported (an annotation), so the next night does not report it again.

The reporter is idempotent per run, so a job that did report its own failure is not reported twice.
Reported jobs that finished more than ``ICEBATCH_FINISHED_JOB_RETENTION_SECONDS`` ago are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from icebatch.backends import JobBackend
from icebatch.bus import EventPublisher
from icebatch.events import BatchJobFailed, SnapshotRange
from icebatch.ledger import ResultsLedger
from icebatch.rayjob import LABEL, JobState
from icebatch.settings import Settings

log = logging.getLogger(__name__)
REPORTED = f"{LABEL}/reported"
REPORTED_AT = f"{LABEL}/reported-at"


@dataclass
class ReconcileSummary:
    reported_failures: list[str] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {"reported_failures": self.reported_failures, "marked": self.marked, "deleted": self.deleted}


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _snapshot(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "none") else None
    except ValueError:
        return None


def failure_event(job: JobState, settings: Settings, now: datetime) -> BatchJobFailed:
    to_snapshot = _snapshot(job.annotations.get(f"{LABEL}/to-snapshot"))
    return BatchJobFailed(
        run_id=job.annotations.get(f"{LABEL}/run-id"),
        consumer=settings.consumer,
        source_table=job.annotations.get(f"{LABEL}/source-table", settings.source_table),
        range=SnapshotRange(
            from_exclusive=_snapshot(job.annotations.get(f"{LABEL}/from-snapshot")), to_inclusive=to_snapshot
        )
        if to_snapshot is not None
        else None,
        reason=f"RayJob {job.name} ended {job.failure_reason} without reporting",
        error_type=job.reason or job.job_status or "RayJobFailed",
        stage="cluster",
        retryable=True,
        origin="reconciler",
        rayjob_name=job.name,
        started_at=_time(job.start_time),
        failed_at=_time(job.end_time) or now,
    )


def reconcile(
    settings: Settings,
    *,
    backend: JobBackend,
    ledger: ResultsLedger,
    publisher: EventPublisher,
    now: datetime | None = None,
) -> ReconcileSummary:
    now = now or datetime.now(UTC)
    summary = ReconcileSummary()
    for job in backend.list_jobs(settings.consumer):
        if not job.terminal:
            continue
        if job.annotations.get(REPORTED) != "true":
            run_id = job.annotations.get(f"{LABEL}/run-id")
            committed = ledger.find_run(run_id) if run_id else None
            if job.failed and committed is None:
                publisher.publish(failure_event(job, settings, now))
                summary.reported_failures.append(job.name)
            backend.annotate(job.name, {REPORTED: "true", REPORTED_AT: now.strftime("%Y-%m-%dT%H:%M:%SZ")})
            summary.marked.append(job.name)
            continue
        ended = _time(job.end_time) or _time(job.annotations.get(REPORTED_AT))
        if ended is not None and (now - ended).total_seconds() > settings.finished_job_retention_seconds:
            backend.delete(job.name)
            summary.deleted.append(job.name)
    if summary.reported_failures or summary.deleted:
        log.info("reconciled: %s", summary.to_dict())
    return summary
