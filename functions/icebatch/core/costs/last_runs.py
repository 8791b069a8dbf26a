"""A report's "last runs" block: this run beside the consumer's previous ones, from its ledger (the same record
``icebatch runs`` reads). Pure: the ledger's run records in, text and JSON out."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from icebatch.core.costs.estimate import run_cost
from icebatch.core.costs.money import usd
from icebatch.core.ledger import RunRecord
from icebatch.core.settings import Settings

WIDTH = 64


@dataclass(frozen=True)
class PastRun:
    run_id: str
    ended_at: str  # ISO 8601, UTC
    task_version: int
    rows: int
    cost_usd: float
    usd_per_1k_rows: float | None
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def past_runs(records: Sequence[RunRecord], settings: Settings, *, this_run: str, limit: int) -> list[PastRun]:
    """The consumer's runs before ``this_run``, newest first, at most ``limit`` (resets and unreadable ones out)."""
    billing = settings.billing()
    runs = [r for r in records if not r.is_reset and r.corrupt is None and r.run_id != this_run]
    out = []
    for r in sorted(runs, key=lambda r: r.committed_at_ms, reverse=True)[:limit]:
        totals = r.totals(billing)
        cost = run_cost(totals, settings).lifetime_cost
        ended = datetime.fromtimestamp(r.committed_at_ms / 1000, UTC).isoformat(timespec="seconds")
        out.append(
            PastRun(
                run_id=r.run_id,
                ended_at=ended,
                task_version=r.task_version,
                rows=totals.rows,
                cost_usd=round(cost, 6),
                usd_per_1k_rows=round(cost / totals.rows * 1000, 6) if totals.rows else None,
                closed=r.closed_reason is not None,
            )
        )
    return out


def last_runs_text(runs: Sequence[PastRun], *, this_usd_per_1k_rows: float | None, noun: str = "rows") -> str:
    """The block: one line a past run, then how this run's $ per 1k compares with their median."""
    title = "LAST RUNS"
    lines = [f"{'=' * 4} {title} {'=' * (WIDTH - len(title) - 6)}"]
    if not runs:
        lines.append("(none before this one: the first run of this consumer)")
        return "\n".join(lines)
    for r in runs:
        per_1k = "-" if r.usd_per_1k_rows is None else f"{usd(r.usd_per_1k_rows)}/1k"
        note = " (closed part way)" if r.closed else ""
        lines.append(
            f"{r.ended_at[:16].replace('T', ' ')}  v{r.task_version}  {r.rows:>9,} {noun}  "
            f"{usd(r.cost_usd)}  {per_1k}{note}"
        )
    priced = [r.usd_per_1k_rows for r in runs if r.usd_per_1k_rows is not None]
    if priced and this_usd_per_1k_rows is not None:
        median = statistics.median(priced)
        ratio = this_usd_per_1k_rows / median if median else None
        than = f" ({ratio:.2f}x)" if ratio is not None else ""
        lines.append(
            f"this run: {usd(this_usd_per_1k_rows)} per 1k {noun}; the last {len(priced)} runs' median "
            f"{usd(median)}{than}"
        )
    return "\n".join(lines)
