"""The launch gate: a pure function from what the launcher observed to a decision and a reason.

| trigger  | launches when                                                                 |
| -------- | ----------------------------------------------------------------------------- |
| schedule | backlog > 0 (the nightly drain)                                               |
| append   | backlog >= threshold and the run pays, or the oldest waiting row is older     |
|          | than max staleness                                                            |
| manual   | like append; with ``force``, whenever backlog > 0                             |
| any      | a run part way through its range (chunks committed, then killed): resume it   |

A run pays when its estimate per 1k rows, start-up and idle tail included, is at most the consumer's ceiling
(``icebatch.core.costs.estimate.CostCheck``: its ``max_usd_per_1k_rows``, else a batch API's price for the same tokens).
An append (or a manual launch without ``force``) over the threshold whose run does not pay "waits": the rows it
adds make the next one cheaper per row, until one pays or the oldest row reaches max staleness (then it launches
anyway, and says so). The schedule drains whatever it costs.

In this order, it never launches: for an event that does not concern the consumer ("ignored"); for a
consumer that cannot run as it stands ("source_replaced": its source table is another table than the one
its ledger follows; "invalid_task": a column its task reads is missing or was dropped, or its model's
weights do not fit the GPU worker (``icebatch.core.costs.sizing``); permanent errors
that an operator resolves, alarmed, never retried, never a GPU job); beside
a job of the same range ("already_launched") or another active job of the consumer; with nothing new;
past ``max_attempts`` failed attempts from the same watermark; when the run's estimate exceeds the
consumer's budget (per run, or today's spend plus the estimate per day). ``dry_run`` turns "launch"
into "dry_run" (the manifest is still built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from icebatch.core.costs.estimate import CostCheck
from icebatch.core.costs.money import usd

Decision = Literal[
    "launch", "dry_run", "skip", "wait", "ignored", "already_launched", "source_replaced", "invalid_task"
]
Refused = Literal["source_replaced", "invalid_task"]
REFUSALS: tuple[Refused, ...] = (
    "source_replaced",
    "invalid_task",
)  # permanent: no job, counted as a launch error, alarmed


@dataclass(frozen=True)
class Refusal:
    """The consumer cannot run as it stands (observed before the gate): what and why, in one line."""

    decision: Refused
    reason: str


@dataclass(frozen=True)
class ActiveJob:
    name: str
    same_range: bool  # started from the watermark this launch would start from


@dataclass(frozen=True)
class GateInput:
    kind: Literal["schedule", "append", "manual"]
    force: bool
    dry_run: bool
    backlog_rows: int
    oldest_age_seconds: float | None
    threshold: int
    max_staleness_seconds: int
    active_job: ActiveJob | None
    failed_attempts: int
    max_attempts: int
    estimate_usd: float = 0.0
    max_usd_per_run: float | None = None
    spent_today_usd: float = 0.0
    max_usd_per_day: float | None = None
    ignore_reason: str | None = None
    refusal: Refusal | None = None
    resume: str | None = None  # a run part way through its range (``Pending.describe()``)
    removals: int = 0  # no new rows, but rows deleted since the watermark: verdicts to remove
    rewritten: int = 0  # no new rows, but rows rewritten (copy-on-write) since the watermark: matched by content
    deferred: bool = False  # the range's last attempt had no model and found changed rows that need it
    cost: CostCheck | None = None  # the run's price against the consumer's ceiling (None: no cost gate)
    lead_seconds: float = 0.0  # how much earlier than max staleness a run must start (``staleness_lead``)

    @property
    def stale(self) -> bool:
        """The oldest waiting row would wait past the consumer's max staleness (0: never) unless a run starts now: its
        age and a run's start-up reach it."""
        return (
            self.max_staleness_seconds > 0
            and self.oldest_age_seconds is not None
            and self.oldest_age_seconds + self.lead_seconds >= self.max_staleness_seconds
        )


@dataclass(frozen=True)
class GateResult:
    decision: Decision
    reason: str
    over_budget: bool = False


def staleness_lead(first_commit_seconds: float, oldest_age_seconds: float | None, commits: int) -> float:
    """How long before the oldest row reaches max staleness a run must be launched: what a run takes to commit its first
    chunk (start-up and the chunk's rows: the oldest rows are in it), and the wait for the trigger after this one,
    expected one commit interval away (the mean gap between the waiting commits)."""
    gap = oldest_age_seconds / max(1, commits - 1) if oldest_age_seconds and commits > 0 else 0.0
    return first_commit_seconds + gap


def decide(g: GateInput) -> GateResult:
    blocked = _blocked(g)
    if blocked is not None:
        return blocked
    why = _why_launch(g)
    if why is None:
        age = "" if g.oldest_age_seconds is None else f", oldest waiting {g.oldest_age_seconds:.0f} s"
        return GateResult("skip", f"backlog {g.backlog_rows} < threshold {g.threshold}{age}")
    if (waits := _waits_for_rows_that_pay(g)) is not None:
        return waits
    refused = _over_budget(g)
    if refused is not None:
        return refused
    if g.dry_run:
        return GateResult("dry_run", f"would launch: {why}")
    return GateResult("launch", why)


def _blocked(g: GateInput) -> GateResult | None:
    if g.ignore_reason is not None:
        return GateResult("ignored", g.ignore_reason)
    if g.refusal is not None:
        return GateResult(g.refusal.decision, g.refusal.reason)
    if g.active_job is not None and g.active_job.same_range:
        return GateResult("already_launched", f"{g.active_job.name} is already running for this range")
    if g.active_job is not None:
        return GateResult("skip", f"job {g.active_job.name} is still active for this consumer")
    if g.backlog_rows <= 0 and g.removals <= 0 and g.rewritten <= 0:
        return GateResult("skip", "nothing new since the watermark")
    if g.failed_attempts >= g.max_attempts:
        stuck = f"; {g.resume}, stuck before its next chunk" if g.resume else ""
        return GateResult(
            "skip",
            f"{g.failed_attempts} attempts from this watermark failed (max {g.max_attempts}){stuck}: an operator "
            "must look at the failure reports before icebatch tries again (see `icebatch launch --help`)",
        )
    return None


def _why_no_new_rows(g: GateInput) -> str:
    """A run over rows deleted or rewritten since the watermark, none added."""
    if g.deferred:
        return (
            f"{g.rewritten} rewritten rows since the watermark: the range's last attempt (no model) found rows "
            "whose content changed; this one has the model"
        )
    if not g.rewritten:
        return f"{g.removals} deleted rows since the watermark: their verdicts removed (no model, no GPU)"
    later = "(no model, no GPU; should some have changed, the range's next attempt has the model)"
    if not g.removals:
        return f"{g.rewritten} rows rewritten (copy-on-write) since the watermark: matched by content {later}"
    return (
        f"{g.removals} deleted and {g.rewritten} rewritten (copy-on-write) rows since the watermark: verdicts of "
        f"deleted rows removed, rewritten rows matched by content {later}"
    )


def _why_launch(g: GateInput) -> str | None:
    if g.resume is not None:
        return f"resume {g.resume}"
    if g.backlog_rows <= 0:  # whatever the trigger and the threshold: an erased row's verdict goes at once
        return _why_no_new_rows(g)
    if g.kind == "schedule":
        return f"scheduled drain of {g.backlog_rows} rows"
    if g.kind == "manual" and g.force:
        return f"forced manual launch ({g.backlog_rows} rows)"
    if g.stale:
        assert g.oldest_age_seconds is not None
        unpaid = f"; launched though {g.cost.summary()}" if gated(g) and g.cost and not g.cost.pays else ""
        return (
            f"backlog {g.backlog_rows}{' <' if g.backlog_rows < g.threshold else ' >='} threshold {g.threshold}, "
            f"and the oldest row has waited {g.oldest_age_seconds:.0f} s{_lead(g)} >= max staleness "
            f"{g.max_staleness_seconds} s{unpaid}"
        )
    if g.backlog_rows >= g.threshold:
        paid = f": {g.cost.summary()}" if gated(g) and g.cost else ""
        return f"backlog {g.backlog_rows} >= threshold {g.threshold}{paid}"
    return None


def _lead(g: GateInput) -> str:
    return f" (+ {g.lead_seconds:.0f} s: a run's first commit, the next trigger's wait)" if g.lead_seconds else ""


def gated(g: GateInput) -> bool:
    """The cost gate applies: an append, or a manual launch without force, of new rows (not a resume)."""
    return g.cost is not None and g.resume is None and g.backlog_rows > 0 and g.kind != "schedule" and not g.force


def _waits_for_rows_that_pay(g: GateInput) -> GateResult | None:
    if not gated(g) or g.cost is None or g.cost.pays or g.stale:
        return None
    age = "" if g.oldest_age_seconds is None else f"{g.oldest_age_seconds:.0f} s"
    stale = f"; the oldest row has waited {age} of max staleness {g.max_staleness_seconds} s" if age else ""
    if g.max_staleness_seconds == 0:
        stale = "; no max staleness: it waits until a run pays, the schedule drains, or a forced launch"
    return GateResult("wait", f"waiting for a run that pays: {g.cost.summary()}{stale}")


def _over_budget(g: GateInput) -> GateResult | None:
    return over_budget(g.estimate_usd, g.spent_today_usd, g.max_usd_per_run, g.max_usd_per_day)


def over_budget(
    estimate_usd: float, spent_today_usd: float, max_usd_per_run: float | None, max_usd_per_day: float | None
) -> GateResult | None:
    """The budget's refusal of a run estimated at ``estimate_usd`` (None: the budget allows it)."""
    if max_usd_per_run is not None and estimate_usd > max_usd_per_run:
        return GateResult(
            "skip",
            f"over budget: the run is estimated at {usd(estimate_usd)}, more than the consumer's "
            f"{usd(max_usd_per_run)} per run (see `icebatch estimate`; raise the budget in the consumers "
            "file, or `icebatch ledger reset` to start later)",
            over_budget=True,
        )
    if max_usd_per_day is not None and spent_today_usd + estimate_usd > max_usd_per_day:
        return GateResult(
            "skip",
            f"over budget: {usd(spent_today_usd)} spent today plus an estimated {usd(estimate_usd)} is more "
            f"than the consumer's {usd(max_usd_per_day)} per day; the next day's schedule tries again",
            over_budget=True,
        )
    return None
