"""Every run of every consumer, and what they cost per day: ``icebatch runs`` and ``icebatch costs``.

Two records, read together:

- **the ledger** (the results table's history, wherever the catalog is: local or Glue): runs that completed,
  runs closed part way (their range's end expired), resets with their reason, and the run part way through;
  their figures are those the reports give (``run_cost``: every attempt's lifetime, at the rate the run
  recorded);
- **the deployment's failures**: attempts that failed, were interrupted or stalled. Locally, the local bus's
  log (``$ICEBATCH_HOME/events.jsonl``); on AWS, where those events go to EventBridge and the reporter (SNS),
  the records the reporter writes under the ``s3://`` warehouse (``icebatch.control.failure_records``).

A day's spend is its completed and closed runs' cost (the figure the budget's ``max_usd_per_day`` is held to)
plus the GPU time of failed attempts that committed nothing (an attempt that committed chunks is in its run's
figure up to its last commit).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from icebatch.control.failure_records import failures_on_record
from icebatch.core.consumers import Consumer
from icebatch.core.costs.estimate import attempt_cost, run_cost
from icebatch.core.events import BatchJobFailed
from icebatch.core.ledger import Key, ResultsLedger, RunRecord, RunTotals
from icebatch.core.settings import Settings

log = logging.getLogger(__name__)

STATUSES = ("completed", "resumed", "closed", "reset", "in_progress", "failed", "interrupted", "stalled")


@dataclass(frozen=True)
class RunRow:
    """One line of the history: a run (or a reset, or one failed attempt)."""

    consumer: str
    run_id: str
    status: str  # one of STATUSES
    task_version: int
    started_at: str | None  # ISO 8601, UTC
    ended_at: str | None  # ISO 8601, UTC (None: in progress)
    seconds: float  # the attempts' lifetimes
    rows: int
    rows_error: int
    attempts: int
    cost_usd: float  # GPU lifetime at the run's rate, what the reports give
    from_snapshot: int | None = None
    to_snapshot: int | None = None
    note: str = ""  # a reset's or a close's reason, a failure's
    committed: bool = True  # a failed attempt: whether it committed rows (its time is then in its run's cost)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def ledger_rows(ledger: ResultsLedger, consumer: Consumer, settings: Settings) -> list[RunRow]:
    """The consumer's runs as its ledger records them (every task version), the run part way through first."""
    billing = settings.billing()
    rows = [_from_record(r, consumer, settings) for r in ledger.runs()]
    pending = ledger.pending()
    if pending is not None:
        head = pending.head
        totals = head.totals(billing)
        rows.insert(
            0,
            RunRow(
                consumer=consumer.name,
                run_id=pending.run_id,
                status="in_progress",
                task_version=head.task_version,
                started_at=totals.started_at or None,
                ended_at=None,
                seconds=pending.attempt_seconds,
                rows=pending.rows_committed,
                rows_error=totals.rows_error,
                attempts=pending.attempts,
                cost_usd=run_cost(totals, settings).lifetime_cost,
                from_snapshot=pending.from_snapshot_exclusive,
                to_snapshot=pending.to_snapshot_inclusive,
                note=(
                    f"{pending.rows_committed:,} of {pending.range_rows:,} rows committed in {pending.chunks} chunk(s)"
                ),
            ),
        )
    return rows


def _from_record(r: RunRecord, consumer: Consumer, settings: Settings) -> RunRow:
    if r.is_reset:
        return RunRow(
            consumer.name,
            r.run_id,
            "reset",
            r.task_version,
            None,
            _iso(r.committed_at_ms),
            0.0,
            0,
            0,
            0,
            0.0,
            r.from_snapshot_exclusive,
            r.to_snapshot_inclusive or None,
            r.text(Key.RESET_REASON),
        )
    totals = r.totals(settings.billing())
    closed = r.closed_reason
    status = "closed" if closed else "resumed" if totals.attempts > 1 else "completed"
    return RunRow(
        consumer=consumer.name,
        run_id=r.run_id,
        status=status,
        task_version=r.task_version,
        started_at=totals.started_at or _iso(r.committed_at_ms - int(totals.job_seconds * 1000)),
        ended_at=_iso(r.committed_at_ms),
        seconds=totals.job_seconds,
        rows=totals.rows,
        rows_error=totals.rows_error,
        attempts=totals.attempts,
        cost_usd=run_cost(totals, settings).lifetime_cost,
        from_snapshot=r.from_snapshot_exclusive,
        to_snapshot=r.range_end if closed else r.to_snapshot_inclusive,
        note=closed or r.corrupt or _job_notes(totals),
    )


def _job_notes(totals: RunTotals) -> str:
    """What a lingering job (``icebatch_job.linger``) made of the run: taken warm, or the run that paid its window; and
    the consumers a shared job (``icebatch_job.shared``) took through the same engine."""
    notes = ["taken warm by a lingering job (its time includes the wait before it)"] if totals.warm else []
    if totals.linger_seconds:
        notes.append(f"its job then kept the node up to {totals.linger_seconds:.0f} s (billed here)")
    if totals.shared_with:
        notes.append(f"one engine with {', '.join(totals.shared_with)}: paid {totals.share:.0%} of the node")
    return "; ".join(notes)


def failed_attempts(failures: Iterable[BatchJobFailed], consumers: Iterable[str], settings: Settings) -> list[RunRow]:
    """Attempts that ended before their run's last commit, one per failure (the same failure reported twice, by the
    job and by the nightly reconciliation, or found in both records, is one attempt)."""
    wanted, seen = set(consumers), set()
    rows = []
    for detail in failures:
        attempt = (detail.consumer, detail.run_id, detail.failed_at)
        if detail.consumer not in wanted or attempt in seen:
            continue
        seen.add(attempt)
        kind = {"JobInterrupted": "interrupted", "JobStalled": "stalled"}.get(detail.error_type, "failed")
        rows.append(
            RunRow(
                consumer=detail.consumer,
                run_id=detail.run_id or "-",
                status=kind,
                task_version=detail.task_version or 0,
                started_at=detail.started_at.isoformat(timespec="milliseconds") if detail.started_at else None,
                ended_at=detail.failed_at.isoformat(timespec="milliseconds"),
                seconds=detail.job_seconds or 0.0,
                rows=detail.rows_processed,
                rows_error=0,
                attempts=1,
                cost_usd=attempt_cost(detail, settings),
                from_snapshot=detail.range.from_exclusive if detail.range else None,
                to_snapshot=detail.range.to_inclusive if detail.range else None,
                note=f"{detail.stage}: {detail.reason}"[:300],
                committed=detail.attempt_rows_committed > 0,
            )
        )
    return rows


def history(
    settings: Settings, consumers: list[Consumer], ledgers: dict[str, ResultsLedger], *, since: datetime | None = None
) -> list[RunRow]:
    """Every consumer's runs and failed attempts, newest first (a run in progress on top); ``since``: failed
    attempts on record in S3 are read from then on (the others are all read: they are at hand)."""
    names = [c.name for c in consumers]
    rows = [row for c in consumers for row in ledger_rows(ledgers[c.name], c, settings)]
    rows += failed_attempts(failures_on_record(settings, names, since=since), names, settings)
    return sorted(rows, key=lambda r: (r.ended_at is None, r.ended_at or r.started_at or ""), reverse=True)


@dataclass(frozen=True)
class DaySpend:
    day: str  # YYYY-MM-DD (UTC)
    consumer: str
    runs: int
    failed_attempts: int
    rows: int
    cost_usd: float
    budget_usd: float | None  # the consumer's max_usd_per_day

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spend_per_day(rows: Iterable[RunRow], consumers: list[Consumer], since: datetime) -> list[DaySpend]:
    """Spend per consumer per UTC day since ``since``: runs completed or closed that day, and failed attempts that
    committed nothing (their time is in no run's figure)."""
    budgets = {c.name: c.budget.max_usd_per_day if c.budget else None for c in consumers}
    days: dict[tuple[str, str], list[RunRow]] = defaultdict(list)
    for r in rows:
        counted = r.status in ("completed", "resumed", "closed") or (r.status in _FAILED and not r.committed)
        if counted and r.ended_at and r.ended_at >= since.isoformat(timespec="seconds"):
            days[(r.ended_at[:10], r.consumer)].append(r)
    return [_day(day, name, rs, budgets.get(name)) for (day, name), rs in sorted(days.items(), reverse=True)]


def _day(day: str, consumer: str, rows: list[RunRow], budget: float | None) -> DaySpend:
    runs = [r for r in rows if r.status not in _FAILED]
    return DaySpend(
        day,
        consumer,
        len(runs),
        len(rows) - len(runs),
        sum(r.rows for r in runs),
        sum(r.cost_usd for r in rows),
        budget,
    )


_FAILED = ("failed", "interrupted", "stalled")
