"""A drained job that keeps its node: it takes the commits that land while it waits, each as a run of its own.

When a job has committed its range, it asks whether to keep its node for an idle window (the consumer's
``linger_seconds``, else, on EKS, what a cold start costs in time; a local job, which runs in the command that
launched it, lingers only where ``linger_seconds`` is set): yes when the rows that landed within the last window
would have paid for a cold start of their own (``icebatch.core.costs.lease.keeps_node``, the rule ``bench.day``
simulates). Then it polls the source's metadata (never a data file) until rows land or the window passes. Rows
that land are a run like any other: a new run id, its own plan, chunks, watermark commit, event and report, exactly
once as every run is; the launcher sees the job running and starts no other for the consumer. The node, the image,
Ray and the weights on local disk stay; the engine starts again for each run (a Ray dataset cannot stay open
across ranges: docs/limitations.md).

What the node costs while it waits is billed so that a job's runs add up to its node's lifetime: a run taken warm
(``RunTotals.warm``) pays its time from the commit before it (the wait included) and no cluster tail of its own, and
its start-up is not a cold start's (``estimate.pace`` leaves it out); the job's last window, which no run follows,
is paid by the run that first kept the node (``RunTotals.linger_seconds``, idle tail in its report). Exact when the
job ends as a window passes with nothing; one window over when it ends otherwise (a signal, its deadline, or rows
that no longer pay for the node): a job's figure is never below what its node cost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from icebatch.core.consumers import Consumer
from icebatch.core.costs.lease import Member, idle_window_seconds, keeps_node
from icebatch.core.ledger import ResultsLedger
from icebatch.core.ledger.backlog import added_rows
from icebatch.core.settings import Settings

log = logging.getLogger(__name__)

MAX_POLL_SECONDS = 10.0  # a metadata read (a catalog call, one small file) every 10 s at most, while it waits


@dataclass(frozen=True)
class Linger:
    """Whether a drained job keeps its node, for how long, and why (one line for its log)."""

    seconds: float
    keeps: bool
    why: str

    @property
    def poll_seconds(self) -> float:
        return min(MAX_POLL_SECONDS, max(0.5, self.seconds / 20))


def decide(ledger: ResultsLedger, consumer: Consumer, settings: Settings, *, now_ms: int | None = None) -> Linger:
    """At the end of a run's range: keep the node when the rows that landed within the last idle window would have
    paid for a cold start of their own (none with a window of 0)."""
    return decide_group([(ledger, consumer)], settings, now_ms=now_ms)


def decide_group(
    members: Sequence[tuple[ResultsLedger, Consumer]], settings: Settings, *, now_ms: int | None = None
) -> Linger:
    """``decide`` for a job's consumers together (a shared job keeps one node for all): the longest of their idle
    windows, and the rows that landed within it for each, priced as one job (``lease.keeps_node``)."""
    consumers = [c for _, c in members]
    if any(c.linger_seconds is None for c in consumers) and settings.top.backend != "kuberay":
        # a local job runs in the command that launched it (`icebatch launch`, `make demo`): it waits only if asked
        return Linger(0.0, False, "a local job lingers only where its consumers set linger_seconds")
    runs = {c.name: ledger.runs() for ledger, c in members}
    window = max(idle_window_seconds(c, runs[c.name], settings) for c in consumers)
    if window <= 0:
        return Linger(0.0, False, "linger_seconds is 0")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    landed = [Member(c, landed_rows(ledger, since_ms=now - int(window * 1000)), runs[c.name]) for ledger, c in members]
    keeps = keeps_node(landed, settings)
    rows = sum(m.rows for m in landed)
    noun = consumers[0].row_noun if len(consumers) == 1 else "rows"
    whose = f" for {', '.join(c.name for c in consumers)}" if len(consumers) > 1 else ""
    asked = all(c.linger_seconds is not None for c in consumers)
    why = (
        f"{rows:,} {noun} landed within the last {window:.0f} s{whose}: "
        + ("enough to pay for a cold start of their own" if keeps else "too few to pay for an idle node")
        if not asked or not keeps
        else f"{rows:,} {noun} landed within the last {window:.0f} s{whose} (linger_seconds)"
    )
    return Linger(window, keeps, why)


def landed_rows(ledger: ResultsLedger, *, since_ms: int) -> int:
    """Rows the source's appends added at or after ``since_ms`` (its current branch, from metadata)."""
    source = ledger.source()
    snapshot = source.metadata.current_snapshot()
    rows = 0
    while snapshot is not None and snapshot.timestamp_ms >= since_ms:
        operation = snapshot.summary.operation.value if snapshot.summary is not None else "append"
        if operation in ("append", "overwrite"):
            rows += added_rows(snapshot, source.io)
        parent = snapshot.parent_snapshot_id
        snapshot = source.metadata.snapshot_by_id(parent) if parent is not None else None
    return rows


def wait_for_rows(
    ledgers: Sequence[ResultsLedger],
    linger: Linger,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Poll the sources until a run of any of the job's consumers has something to do (True) or the window passes
    (False)."""
    deadline = clock() + linger.seconds
    while True:
        for ledger in ledgers:
            backlog = ledger.backlog()
            if backlog.rows > 0 or backlog.rewrites or backlog.deleted_rows > 0:
                return True
        left = deadline - clock()
        if left <= 0:
            return False
        sleep(min(linger.poll_seconds, left))
