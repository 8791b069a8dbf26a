"""Nothing the job starts outlives it: a watchdog process that kills the job's descendants when it dies.

The job starts a Ray instance of its own (GCS, raylet, dashboard and runtime-env agents, workers, vLLM's
engine core). Killed without notice (SIGKILL, an OOM kill), the job runs no clean-up, and those
processes are re-parented to PID 1, where some linger for minutes holding ports and memory. In a pod
that does not matter (the container goes), on a laptop or a CI machine it does.

``start_reaper()`` forks a small watchdog before anything else starts. While the job lives, the
watchdog keeps the set of the job's descendants up to date from ``/proc`` (parent links, once a second);
when the job ends, however it ends (the watchdog sees its end of a pipe close, at once), it sends SIGKILL to
every process it last saw descending from the job, and to their descendants, and exits. A job that shuts
down cleanly has nothing left for it to kill. The watchdog holds none of the job's standard streams: a
reader of the job's output (a pipe, a pod's log) sees its end when the job ends. Linux only (elsewhere it
does nothing).
"""

from __future__ import annotations

import os
import select
import signal
import sys
from pathlib import Path

POLL_SECONDS = 1.0


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process visible in /proc."""
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry.name)] = int(fields[1])
    return out


def descendants(root: int, parents: dict[int, int] | None = None) -> set[int]:
    """Every process whose chain of parents leads to ``root``."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _watch(job: int, ended: int, me: int, poll_seconds: float) -> None:
    """The watchdog's life: follow the job's tree until the pipe closes, then kill what is left of it."""
    known: set[int] = set()
    while True:
        known |= descendants(job) - {me}
        readable, _, _ = select.select([ended], [], [], poll_seconds)
        if readable and os.read(ended, 1) == b"":
            break  # every write end is closed: the job has ended
    parents = _parents()
    left = set()
    for pid in known:  # orphans now hang from PID 1: what they started hangs from them
        if pid in parents:
            left |= {pid} | descendants(pid, parents)
    for pid in left - {me}:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def start_reaper(poll_seconds: float = POLL_SECONDS) -> int | None:
    """Fork the watchdog (once per process); its pid, or None where there is no /proc.

    ``poll_seconds``: how often it looks for the job's new descendants (its end it sees at once).
    """
    if not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists():
        return None
    job = os.getpid()
    ended, alive = os.pipe()  # the job holds `alive` open until it dies; not inherited across exec
    pid = os.fork()
    if pid == 0:  # the watchdog: no Python clean-up of the job's state may run here
        try:
            os.close(alive)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the job's group is the job's
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            quiet = os.open(os.devnull, os.O_RDWR)
            for stream in (0, 1, 2):  # the job's reader sees its end when the job ends, not when this one does
                os.dup2(quiet, stream)
            _watch(job, ended, os.getpid(), poll_seconds)
        finally:
            os._exit(0)
    os.close(ended)
    return pid
