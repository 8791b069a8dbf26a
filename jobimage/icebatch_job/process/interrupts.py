"""Graceful preemption: SIGTERM stops the run at the next safe point; a second signal exits at once.

Kubernetes sends SIGTERM on a spot interruption notice, a node drain or the RayJob's deadline, then
SIGKILL after the grace period. On the first SIGTERM (or SIGINT) the job stops taking rows from the
engine, commits the rows it has finished (``ChunkCommitter.drain``), emits "Batch Job Failed" with
``resumable: true`` and exits; a watchdog ends the process if that takes longer than
``ICEBATCH_DRAIN_SECONDS``. A signal that arrives during a commit waits for the commit to end (a commit
cut in half is only settled by the next attempt). A second signal exits at once.

``stop(reason)`` does what a first SIGTERM does, from another thread, for a reason the failure reports:
the stall watch (``icebatch_job.process.stall``) uses it.
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


class JobStalled(JobInterrupted):
    """The run waited too long for a result (``icebatch_job.process.stall``): stop as on SIGTERM; its text says why."""


class Interrupts:
    def __init__(self, drain_seconds: float) -> None:
        self.drain_seconds = drain_seconds
        self.signal: int | None = None
        self.reason: str | None = None  # set by ``stop``
        self._deadline: threading.Timer | None = None  # the drain's, once a first signal came
        self._depth = 0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this (main) thread (again after something replaced the handlers:
        ``uninstall`` still puts back the ones from before the first install)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(signum, self._on_signal)
            self._previous.setdefault(signum, previous)

    def uninstall(self) -> None:
        """The previous handlers back, and no drain deadline (for a process that goes on: a test)."""
        if self._deadline is not None:
            self._deadline.cancel()
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
            raise self._stopping()

    def stop(self, reason: str) -> None:
        """From another thread: stop the run as a first SIGTERM does, for ``reason`` (unless it is stopping)."""
        if self.requested:
            return
        self.reason = reason
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)  # wakes a main thread that waits

    def _stopping(self) -> JobInterrupted:
        if self.reason:
            return JobStalled(self.reason)
        name = signal.Signals(self.signal or signal.SIGTERM).name
        return JobInterrupted(f"by {name}; the next attempt resumes the run")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            _say(f"icebatch-job: second signal ({signum}): exiting at once")
            os._exit(EXIT_INTERRUPTED)
        self.signal = signum
        why = self.reason or f"signal {signum}"
        _say(
            f"icebatch-job: {why}: committing the finished rows, then exiting (within {self.drain_seconds:g} s; a "
            "second signal exits at once)"
        )
        self._deadline = threading.Timer(self.drain_seconds, self._expired)
        self._deadline.daemon = True
        self._deadline.start()
        if self._depth == 0:
            raise self._stopping()

    def _expired(self) -> None:
        _say(f"icebatch-job: not done {self.drain_seconds:g} s after the signal (ICEBATCH_DRAIN_SECONDS): exiting")
        os._exit(EXIT_INTERRUPTED)


def _say(line: str) -> None:
    """A line to stderr from a signal handler: one unbuffered write. The handler runs in the main thread between
    two of its bytecodes, possibly inside its own print to stderr: a second print there raises ``RuntimeError:
    reentrant call`` in place of the job's stop (seen with a failpoint's message)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream with no descriptor (a test's capture)
        fd = 2
    try:
        os.write(fd, f"{line}\n".encode())
    except OSError:  # nowhere to say it: the exit code still does
        pass
