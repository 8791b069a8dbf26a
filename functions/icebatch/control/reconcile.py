"""Reconciliation: jobs that ended without saying so get reported, and finished jobs do not pile up.

A job that is killed (activeDeadlineSeconds, OOM, a failed submitter pod, a lost node) cannot emit its
own "Batch Job Failed". On every nightly schedule the launcher lists the deployment's jobs and, for each
terminal job not yet marked ``icebatch.io/reported``:

- failed and its run is not complete in the ledger -> emit "Batch Job Failed" (``origin: reconciler``),
  with the rows its run has committed so far (the chunks stay; the next launch resumes the run); unless
  another run, started from the same watermark, completed the range: the job lost a race (its own exit
  status said "conflict"), which is not a failure and pages no one;
- a shared job (``icebatch.control.jobs.members``): the same for each consumer's run in it, from its own annotations;
- then mark it reported (an annotation), so the next night does not report it again.

The reporter is idempotent per run, so a job that did report its own failure is not reported twice.
Reported jobs that finished more than ``ICEBATCH_FINISHED_JOB_RETENTION_SECONDS`` ago are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from icebatch.control.backends import JobBackend
from icebatch.control.jobs import JobState, members
from icebatch.control.rayjob import LABEL
from icebatch.core.bus import EventPublisher
from icebatch.core.consumers import Consumer
from icebatch.core.events import BatchJobFailed, SnapshotRange
from icebatch.core.ledger import Pending, ResultsLedger
from icebatch.core.settings import Settings
from icebatch.core.untrusted import whole_number

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
    """A snapshot id the launcher annotated (plain digits), else None: the range is then not named."""
    return whole_number(value) if value else None


# what KubeRay's reason for ending a RayJob means here, and where to look
HINTS = {
    "PreRunningDeadlineExceeded": "its cluster was not running its job within ICEBATCH_JOB_START_DEADLINE_SECONDS: "
    "look at GPU capacity (Karpenter's NodeClaims), the image pull and the pods' events",
    "DeadlineExceeded": "it ran past ICEBATCH_JOB_DEADLINE_SECONDS (activeDeadlineSeconds)",
}


def failure_event(
    job: JobState, consumer: Consumer, settings: Settings, now: datetime, pending: Pending | None = None
) -> BatchJobFailed:
    """What the job would have said, from its annotations and (``pending``) the chunks its run committed."""
    to_snapshot = _snapshot(job.annotations.get(f"{LABEL}/to-snapshot"))
    mine = pending is not None and pending.run_id == job.annotations.get(f"{LABEL}/run-id")
    hint = f"; {HINTS[job.reason]}" if job.reason in HINTS else ""
    return BatchJobFailed(
        deployment=settings.top.deployment,
        run_id=job.annotations.get(f"{LABEL}/run-id"),
        consumer=consumer.name,
        task=consumer.task.name,
        task_version=consumer.task_version,
        source_table=job.annotations.get(f"{LABEL}/source-table", consumer.source_table),
        range=SnapshotRange(
            from_exclusive=_snapshot(job.annotations.get(f"{LABEL}/from-snapshot")), to_inclusive=to_snapshot
        )
        if to_snapshot is not None
        else None,
        reason=f"RayJob {job.name} ended {job.failure_reason} without reporting{hint}"[:2000],
        error_type=(job.reason or job.job_status or "RayJobFailed")[:128],
        stage="cluster",
        retryable=True,
        resumable=True,
        rows_committed=pending.rows_committed if pending is not None and mine else 0,
        origin="reconciler",
        rayjob_name=job.name,
        started_at=_time(job.start_time),
        failed_at=_time(job.end_time) or now,
    )


def covered_by(ledger: ResultsLedger, job: JobState, consumer: Consumer) -> str | None:
    """The run (not the job's own) that completed a range from the watermark the job started from, for the
    consumer's task version the job ran: the job's range is done, by someone else. None when none did, or when
    the job's annotations do not say where it started."""
    raw = job.annotations.get(f"{LABEL}/from-snapshot")
    start = None if raw == "none" else _snapshot(raw)
    if raw is None or (raw != "none" and start is None):
        return None
    if job.annotations.get(f"{LABEL}/task") != f"{consumer.task.name}@v{consumer.task_version}":
        return None
    own = job.annotations.get(f"{LABEL}/run-id")
    return next(
        (
            r.run_id
            for r in ledger.runs()
            if not r.is_reset
            and r.corrupt is None
            and r.task_version == consumer.task_version
            and r.from_snapshot_exclusive == start
            and r.run_id != own
        ),
        None,
    )


@dataclass
class Reconciler:
    settings: Settings
    consumers: dict[str, Consumer]
    catalog: Any
    backend: JobBackend
    publisher: EventPublisher
    now: datetime
    summary: ReconcileSummary = field(default_factory=ReconcileSummary)

    def run(self) -> ReconcileSummary:
        for job in self.backend.list_jobs(self.settings.top.deployment):
            if not job.terminal:
                continue
            if job.annotations.get(REPORTED) != "true":
                self.report_once(job)
            elif self.expired(job):
                self.backend.delete(job.name)
                self.summary.deleted.append(job.name)
        if self.summary.reported_failures or self.summary.deleted:
            log.info("reconciled: %s", self.summary.to_dict())
        return self.summary

    def report_once(self, job: JobState) -> None:
        """A job that ended: a failure reported for each of its runs (a shared job's too) that did not complete."""
        for run in members(job):
            self.report_run(run)
        self.backend.annotate(job.name, {REPORTED: "true", REPORTED_AT: self.now.strftime("%Y-%m-%dT%H:%M:%SZ")})
        self.summary.marked.append(job.name)

    def report_run(self, job: JobState) -> None:
        consumer = self.consumers.get(job.consumer or "")
        run_id = job.annotations.get(f"{LABEL}/run-id")
        if consumer is None:
            log.warning("job %s belongs to consumer %r, no longer declared: not reported", job.name, job.consumer)
        elif job.failed:
            ledger = ResultsLedger(self.catalog, consumer)
            if run_id is None or ledger.find_run(run_id) is None:
                winner = covered_by(ledger, job, consumer)
                if winner is not None:
                    log.info(
                        "job %s ended failed, but run %s completed %s's range from the same watermark: a race "
                        "it lost, not reported as a failure",
                        job.name,
                        winner,
                        consumer.name,
                    )
                else:
                    self.publisher.publish(failure_event(job, consumer, self.settings, self.now, ledger.pending()))
                    self.summary.reported_failures.append(job.name)

    def expired(self, job: JobState) -> bool:
        ended = _time(job.end_time) or _time(job.annotations.get(REPORTED_AT))
        retention = self.settings.launch.finished_job_retention_seconds
        return ended is not None and (self.now - ended).total_seconds() > retention


def reconcile(
    settings: Settings,
    consumers: list[Consumer],
    *,
    catalog: Any,
    backend: JobBackend,
    publisher: EventPublisher,
    now: datetime | None = None,
) -> ReconcileSummary:
    """Report the deployment's jobs that ended silently (once), and delete old reported ones."""
    by_name = {c.name: c for c in consumers}
    return Reconciler(settings, by_name, catalog, backend, publisher, now or datetime.now(UTC)).run()
