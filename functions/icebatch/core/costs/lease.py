"""A job as a GPU lease: one start-up paid for several consumers' rows, and for the rows that keep landing.

A job's bill is a fixed part (start-up: node, image, weights, engine; the idle tail after it) and a part per row
(``estimate``). The cost gate asks whether one consumer's run pays for its fixed part. A lease spreads
that part over more rows:

- **Sharing**: consumers of one model due together run in one job: the fixed part is paid once (the largest of
  theirs), and each consumer's report carries a share of it in proportion to its tokens. ``group_check`` is the cost
  gate for such a group: it pays when the group's cost is at most what each consumer's ceiling allows its own rows.
- **Lingering**: a job that drained its range keeps its node and takes the commits that land, while the rows that
  landed within the last idle window would themselves have paid for a cold start (``keeps_node``): at that rate a
  cold start would come within a window anyway. The window defaults to what a cold start costs in time: the
  measured start-up and the idle tail (``idle_window_seconds``). A trickle never pays for an idle GPU; a burst does.
  (A window alone, kept while any rows land, keeps a node up all day under a writer that commits every minute:
  ``bench.day`` measures it.)

Pure functions of the consumers, their runs and the settings: the launcher, the job and ``bench.day`` share them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from icebatch.core.consumers import Consumer
from icebatch.core.costs.estimate import Ceiling, CostCheck, ceiling, estimate_run, idle_tail_seconds, pace
from icebatch.core.ledger.summary import RunRecord
from icebatch.core.settings import Settings


@dataclass(frozen=True)
class Member:
    """A consumer of a shared job: its rows waiting and its runs (what its estimate learns from)."""

    consumer: Consumer
    rows: int
    runs: Sequence[RunRecord] = ()


def group_check(members: Sequence[Member], settings: Settings) -> CostCheck | None:
    """The cost gate for consumers that would share one job (one member: its own gate). None when no member has rows,
    or one has no ceiling (a consumer without a cost gate launches by its threshold alone)."""
    members = [m for m in members if m.rows > 0]
    if not members:
        return None
    estimates = [estimate_run(m.rows, m.consumer, m.runs, settings) for m in members]
    ceilings = [ceiling(m.consumer, e, settings) for m, e in zip(members, estimates, strict=True)]
    if any(c is None for c in ceilings):
        return None
    rows = sum(m.rows for m in members)
    fixed = max(e.fixed_usd for e in estimates)
    per_rows = sum(e.usd - e.fixed_usd for e in estimates)
    allowed = sum(c.usd_per_1k_rows * m.rows for c, m in zip(ceilings, members, strict=True) if c is not None)
    limit = Ceiling(allowed / rows, " + ".join(sorted({c.basis for c in ceilings if c is not None})))
    rows_to_pay = _rows_to_pay(rows, per_rows / rows, fixed, limit.usd_per_1k_rows / 1000)
    at_scale = sum(_per_row(m, settings) * m.rows for m in members) / rows
    return CostCheck((per_rows + fixed) / rows * 1000, limit, rows, rows_to_pay, at_scale * 1000)


def shared_prices(members: Sequence[Member], settings: Settings) -> dict[str, tuple[CostCheck, tuple[str, ...]]]:
    """Each member's run priced with the other members of its model, which would share its job (the launcher submits
    consumers of one model that launch at once as one: ``ICEBATCH_SHARE_JOBS``): consumer -> (the group's check, the
    others). A member alone of its model, or in a group without a cost gate, is left out (its own check stands)."""
    if not settings.launch.share_jobs or settings.engine.engine_mode != "engine":
        return {}
    waiting = [m for m in members if m.rows > 0]
    out = {}
    for m in waiting:
        model = m.consumer.model_source(settings)
        group = [o for o in waiting if o.consumer.model_source(settings) == model]
        if len(group) > 1 and (check := group_check(group, settings)) is not None:
            out[m.consumer.name] = (check, tuple(o.consumer.name for o in group if o is not m))
    return out


def first_commit_seconds(members: Sequence[Member], settings: Settings) -> float:
    """From launch to the first chunk's commit of every member of a shared job: one start-up (the longest), then the
    members' first chunks side by side in one engine."""
    estimates = [estimate_run(m.rows, m.consumer, m.runs, settings) for m in members if m.rows > 0]
    if not estimates:
        return 0.0
    startup = max(e.startup_seconds for e in estimates)
    return startup + sum(e.first_commit_seconds - e.startup_seconds for e in estimates)


def _per_row(m: Member, settings: Settings) -> float:
    return settings.billing().usd_per_hour / pace(m.consumer, m.runs, settings).rows_per_gpu_hour


def _rows_to_pay(rows: int, per_row: float, fixed: float, ceiling_per_row: float) -> int | None:
    """The fewest rows (at least ``rows``) at which ``fixed`` spread over them plus ``per_row`` is at most the
    ceiling (in the proportions the members have now); None when even the part per row is above it."""
    if per_row + fixed / rows <= ceiling_per_row:
        return rows
    if per_row >= ceiling_per_row:
        return None
    return max(rows, math.ceil(fixed / (ceiling_per_row - per_row)))


def fixed_shares(tokens: dict[str, int]) -> dict[str, float]:
    """Each consumer's share of a shared job's fixed part: in proportion to its tokens (equal when none has any)."""
    total = sum(tokens.values())
    if total <= 0:
        return {name: 1 / len(tokens) for name in tokens} if tokens else {}
    return {name: n / total for name, n in tokens.items()}


def idle_window_seconds(consumer: Consumer, runs: Sequence[RunRecord], settings: Settings) -> float:
    """How long a drained job looks back (and waits) for rows: the consumer's ``linger_seconds`` when set, else what
    a cold start costs in time, its measured start-up (the priors before it has runs) and the idle tail."""
    if consumer.linger_seconds is not None:
        return float(consumer.linger_seconds)
    return pace(consumer, runs, settings).fixed_seconds + idle_tail_seconds(settings)


def keeps_node(landed: Sequence[Member], settings: Settings) -> bool:
    """Whether a drained job keeps its node: the rows that landed within the last idle window (per member) would
    have paid for a cold start of their own. Consumers with no cost gate have no price to judge by: their job lingers
    only where each sets ``linger_seconds`` (while rows land within them)."""
    if not any(m.rows > 0 for m in landed):
        return False
    check = group_check(landed, settings)
    if check is not None:
        return check.pays
    return all(m.consumer.linger_seconds is not None for m in landed)
