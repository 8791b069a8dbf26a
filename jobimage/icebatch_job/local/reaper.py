"""The one watcher: for the processes that follow their parent by looking, not by the kernel.

Everything the job starts of its own ends by the kernel's guarantees (``icebatch_job.local.lineage``). Ray's
agents (the dashboard agent and the runtime-env agent, started by the raylet) do not ask the kernel: they
look for their raylet every 0.4 s and, when it was killed rather than stopped, first spend up to 60 s
trying to tell a GCS that died with it. Killed without notice (SIGKILL, an OOM kill, a closed terminal),
the job would leave them running for a minute.

``start_reaper()`` forks a small watchdog before Ray starts, in a session of its own (a signal to the job's
process group, a terminal's SIGHUP, does not reach it). While the job lives, the watchdog keeps the set of
the job's descendants up to date from ``/proc`` (parent links, once a second); when the job ends, however
it ends (the watchdog sees its end of a pipe close, at once), it sends SIGKILL to every process it last saw
descending from the job that is still the same process (its start time), to their descendants, and to every
process that carries the job's mark in its environment (``ICEBATCH_JOB_TREE``, set before Ray starts and
inherited by all it starts: a Ray worker started since the watchdog's last look, orphaned by the kill before
it knew its raylet was gone, is found that way), and unlinks the shared memory the job's processes left,
and exits. A job that shut down
cleanly has nothing left for it to kill. It holds none of the job's standard
streams: a reader of the job's output (a pipe, a pod's log) sees its end when the job ends. Linux only.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import sys
from pathlib import Path

from icebatch_job.local.lineage import carrying, descendants, end_processes, process_table
from icebatch_job.local.shared_memory import unlink_left_segments

POLL_SECONDS = 1.0
TREE_VARIABLE = "ICEBATCH_JOB_TREE"  # the job's mark, in the environment of every process it starts


def _watch(job: int, ended: int, me: int, poll_seconds: float, since: float | None, mark: str) -> None:
    """The watchdog's life: follow the job's tree until the pipe closes, then kill what is left of it."""
    known: dict[int, float] = {}  # pid -> start time (a pid reused by another process is not the job's)
    while True:
        table = process_table()
        parents = {pid: ppid for pid, (ppid, _) in table.items()}
        for pid in descendants(job, parents) - {me}:
            known.setdefault(pid, table[pid][1])
        readable, _, _ = select.select([ended], [], [], poll_seconds)
        if readable and os.read(ended, 1) == b"":
            break  # every write end is closed: the job has ended
    table = process_table()
    parents = {pid: ppid for pid, (ppid, _) in table.items()}
    left: set[int] = set()
    for pid, started in known.items():  # orphans now hang from PID 1: what they started hangs from them
        if pid in table and table[pid][1] == started:
            left |= {pid} | descendants(pid, parents)
    for pid in carrying(f"{TREE_VARIABLE}={mark}") - {me}:  # started since the last look
        left |= {pid} | descendants(pid, parents)
    end_processes(left - {me})  # resource trackers last: they unlink the shared memory the others left
    if since is not None:  # what the engine's processes left of their queues
        unlink_left_segments(since)


def start_reaper(poll_seconds: float = POLL_SECONDS, since: float | None = None) -> int | None:
    """Fork the watchdog; its pid, or None where there is no /proc.

    ``poll_seconds``: how often it looks for the job's new descendants (its end it sees at once);
    ``since``: the job's start; the shared memory its processes left since then is unlinked once the watchdog
    has ended what was left (``icebatch_job.local.shared_memory``).
    """
    if not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists():
        return None
    import psutil  # noqa: F401 (imported before the fork: the watchdog imports nothing, another thread may hold a lock)

    job = os.getpid()
    mark = f"{job}-{secrets.token_hex(8)}"
    os.environ[TREE_VARIABLE] = mark  # before Ray starts: each process it starts inherits it
    ended, alive = os.pipe()  # the job holds `alive` open until it dies; not inherited across exec
    pid = os.fork()
    if pid == 0:  # the watchdog: no Python clean-up of the job's state may run here
        try:
            os.close(alive)
            os.setsid()  # out of the job's process group and terminal: their end is what it waits for
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            quiet = os.open(os.devnull, os.O_RDWR)
            for stream in (0, 1, 2):  # the job's reader sees its end when the job ends, not when this one does
                os.dup2(quiet, stream)
            _watch(job, ended, os.getpid(), poll_seconds, since, mark)
        finally:
            os._exit(0)
    os.close(ended)
    return pid
