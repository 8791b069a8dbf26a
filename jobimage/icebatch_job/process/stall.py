"""A run that stops making progress ends itself, instead of waiting (and billing) until its deadline.

A RayJob can wait without failing: for a GPU node that never comes, an engine that never starts, a node
lost with rows on it while Ray tries to recover them. Kubernetes ends it only at ``activeDeadlineSeconds``
(``ICEBATCH_JOB_DEADLINE_SECONDS``, 4 h by default), billing its nodes all along. So the driver watches its
own pipeline: when it has waited ``ICEBATCH_STALL_SECONDS`` for a result (for the first one, counted from the
pipeline's start, so the engine's start included), it stops as on SIGTERM (``icebatch_job.process.interrupts``): it
commits the rows it has finished and reports a resumable, retryable failure naming the stall, and the
launcher's next attempt resumes the run. Only the wait counts: the driver's own parsing and commits do not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def stall_reason(waited: float, limit: float, results: int) -> str | None:
    """Why the run must stop, after waiting ``waited`` seconds for its next result; None: not yet."""
    if limit <= 0 or waited < limit:
        return None
    if results == 0:
        return (
            f"stalled: no result {waited:.0f} s after the pipeline started (ICEBATCH_STALL_SECONDS={limit:g}): "
            "the engine did not start or got no rows (a GPU node that never came, a model that does not load, "
            "a lost node); the job's log and Ray's say which"
        )
    return (
        f"stalled: no result for {waited:.0f} s after the last one (ICEBATCH_STALL_SECONDS={limit:g}; "
        f"{results:,} rows had arrived): the engine or the read stopped (a lost node?); the job's log and Ray's "
        "say which"
    )


class StallWatch:
    """Calls ``on_stall(reason)`` once, from its own thread, when the driver has waited too long for a result.

    ``waiting()`` when the driver starts waiting for the pipeline's next result; ``arrived(rows)`` when one
    comes (the clock stops until the next ``waiting()``).
    """

    def __init__(self, limit: float, on_stall: Callable[[str], None], *, poll_seconds: float = 1.0) -> None:
        self.limit = limit
        self.on_stall = on_stall
        self.poll_seconds = poll_seconds
        self.results = 0
        self._since: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="icebatch-stall-watch", daemon=True)

    def __enter__(self) -> StallWatch:
        self.waiting()
        if self.limit > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def waiting(self) -> None:
        self._since = time.monotonic()

    def arrived(self, rows: int) -> None:
        self._since = None
        self.results += rows

    def _watch(self) -> None:
        while not self._done.wait(self.poll_seconds):
            since = self._since
            reason = stall_reason(time.monotonic() - since, self.limit, self.results) if since is not None else None
            if reason is not None:
                self._done.set()
                self.on_stall(reason)
