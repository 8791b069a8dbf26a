"""Graceful preemption: SIGTERM stops the run at the next safe point; a second signal exits at once.

Kubernetes sends SIGTERM on a spot interruption notice, a node drain or the RayJob's deadline, then
SIGKILL after the grace period. On the first SIGTERM (or SIGINT) the job stops taking rows from the
engine, commits the rows it has finished (``ChunkCommitter.drain``), emits "Batch Job Failed" with
``resumable: true`` and exits; a watchdog ends the process if that takes longer than
``ICEBATCH_DRAIN_SECONDS``. A signal that arrives during a commit waits for the commit to end (a commit
cut in half is only settled by the next attempt). A second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from icebatch.core.errors import EXIT_INTERRUPTED


class JobInterrupted(KeyboardInterrupt):
    """SIGTERM/SIGINT: stop, commit what is finished, report, exit."""


class Interrupts:
    def __init__(self, drain_seconds: float) -> None:
        self.drain_seconds = drain_seconds
        self.signal: int | None = None
        self._depth = 0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this (main) thread."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()

    @contextmanager
    def critical(self) -> Iterator[None]:
        """A section a first signal must not cut short (it takes effect when the section ends)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self.requested and self._depth == 0:
            raise JobInterrupted()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            print(f"icebatch-job: second signal ({signum}): exiting at once", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        self.signal = signum
        print(f"icebatch-job: signal {signum}: committing the finished rows, then exiting (within "
              f"{self.drain_seconds:g} s; a second signal exits at once)", file=sys.stderr, flush=True)  # fmt: skip
        watchdog = threading.Timer(self.drain_seconds, self._expired)
        watchdog.daemon = True
        watchdog.start()
        if self._depth == 0:
            raise JobInterrupted()

    def _expired(self) -> None:
        print(f"icebatch-job: not done {self.drain_seconds:g} s after the signal (ICEBATCH_DRAIN_SECONDS): exiting",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(EXIT_INTERRUPTED)
