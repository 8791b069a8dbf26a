"""The launch gate: a pure function from (trigger, backlog, active job, policy) to a decision and a reason.

| trigger  | launches when                                                                 |
| -------- | ----------------------------------------------------------------------------- |
| schedule | backlog > 0 (the nightly drain)                                               |
| append   | backlog >= threshold, or the oldest waiting row is older than max staleness   |
| manual   | like append; with ``force``, whenever backlog > 0                             |

Never while a job of the same consumer is active, never past ``max_attempts`` failed attempts from the
same watermark, and ``dry_run`` turns "launch" into "dry_run" (the manifest is still built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Decision = Literal["launch", "dry_run", "skip", "ignored", "already_launched"]


@dataclass(frozen=True)
class GateInput:
    kind: Literal["schedule", "append", "manual"]
    force: bool
    dry_run: bool
    backlog_rows: int
    oldest_age_seconds: float | None
    threshold: int
    max_staleness_seconds: int
    active_job: str | None
    failed_attempts: int
    max_attempts: int
    ignore_reason: str | None = None


@dataclass(frozen=True)
class GateResult:
    decision: Decision
    reason: str


def decide(g: GateInput) -> GateResult:
    if g.ignore_reason is not None:
        return GateResult("ignored", g.ignore_reason)
    if g.active_job is not None:
        return GateResult("skip", f"job {g.active_job} is still active for this consumer")
    if g.backlog_rows <= 0:
        return GateResult("skip", "nothing new since the watermark")
    if g.failed_attempts >= g.max_attempts:
        return GateResult(
            "skip",
            f"{g.failed_attempts} attempts from this watermark failed (max {g.max_attempts}): an operator must "
            "look at the failure reports before icebatch tries again (see `icebatch launch --help`)",
        )
    stale = (
        g.max_staleness_seconds > 0
        and g.oldest_age_seconds is not None
        and g.oldest_age_seconds >= g.max_staleness_seconds
    )
    if g.kind == "schedule":
        why = f"scheduled drain of {g.backlog_rows} rows"
    elif g.kind == "manual" and g.force:
        why = f"forced manual launch ({g.backlog_rows} rows)"
    elif g.backlog_rows >= g.threshold:
        why = f"backlog {g.backlog_rows} >= threshold {g.threshold}"
    elif stale:
        assert g.oldest_age_seconds is not None
        why = (
            f"backlog {g.backlog_rows} < threshold {g.threshold}, but the oldest row has waited "
            f"{g.oldest_age_seconds:.0f} s >= max staleness {g.max_staleness_seconds} s"
        )
    else:
        age = "" if g.oldest_age_seconds is None else f", oldest waiting {g.oldest_age_seconds:.0f} s"
        return GateResult("skip", f"backlog {g.backlog_rows} < threshold {g.threshold}{age}")
    if g.dry_run:
        return GateResult("dry_run", f"would launch: {why}")
    return GateResult("launch", why)
