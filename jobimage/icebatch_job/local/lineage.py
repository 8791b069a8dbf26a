"""Nothing the job starts outlives it: the kernel's guarantees, not a watcher that can die first.

The job starts a Ray instance of its own (GCS, raylet, its agents and workers) and, in the engine's actor,
vLLM's engine core and its model worker, some in process groups of their own. Whatever ends the job (an
exit, SIGTERM, SIGINT, SIGKILL of its process or of its whole process group, its terminal closing), all of
them end with it:

- **Ray's head processes ask the kernel to be killed when their parent dies** (Ray's "kernel fate
  sharing"), and its workers leave when their raylet does; vLLM ends its engine core and model worker when
  the process that started them ends.
- **The job's process is a child subreaper** (``adopt_orphans``: ``PR_SET_CHILD_SUBREAPER``): a process of
  its tree whose parent ends before it is handed to the job, not to PID 1, so the job still knows it; and
  the kernel sends an orphan's death signal again when the subreaper it was handed to dies.
- **On every path that runs code** (``end_descendants``, at exit, after Ray's shutdown) the job kills what
  is left of its tree and reaps it: Ray's workers still shutting down, vLLM's processes, little else.
- Ray's agents, and a process whose parent was killed before it could end it, follow by looking or not at
  all: for them, and only if the job is killed without notice, a watchdog in a session of its own
  (``icebatch_job.local.reaper``).

``ray_instance.own_the_tree`` does the job's part of this before it starts a Ray instance of its own.

Linux only; elsewhere each step does nothing and says so in its return value.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PR_GET_CHILD_SUBREAPER = 37


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0)) == 0


def adopt_orphans() -> bool:
    """Make this process a child subreaper: orphans of its tree are handed to it (False: not Linux)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie too), whoever owns it."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, start time), for every process visible (psutil; zombies included)."""
    import psutil

    out: dict[int, tuple[int, float]] = {}
    for p in psutil.process_iter(["ppid", "create_time"], ad_value=None):
        ppid, started = p.info["ppid"], p.info["create_time"]
        if ppid is not None:
            out[p.pid] = (ppid, started or 0.0)
    return out


def carrying(entry: str) -> set[int]:
    """The live processes of this user whose environment holds ``entry`` ("NAME=value") as it was started
    (a process that overwrote its environment block, as setproctitle does for a long title, is not found)."""
    needle = f"\0{entry}\0".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in b"\0" + (proc / "environ").read_bytes():
                    found.add(int(proc.name))
            except OSError:  # gone meanwhile, or another user's
                continue
    return found


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process visible in /proc (zombies included)."""
    return {pid: ppid for pid, (ppid, _) in process_table().items()}


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


def end_descendants(grace_seconds: float = 5.0) -> list[str]:
    """SIGKILL every process left in this process's tree and reap its children; what it found ("pid name").

    Called when the job ends. Each kill makes the next round's orphans this (subreaper) process's children;
    rounds go on until the tree is empty. Resource trackers go last (``end_processes``).
    """
    if not Path("/proc/self/stat").exists():
        return []
    me = os.getpid()
    found: set[str] = set()
    deadline = time.monotonic() + grace_seconds
    while True:
        _reap()
        left = {pid for pid in descendants(me) if alive(pid) and not _zombie(pid)}
        if not left or time.monotonic() > deadline + 2:  # (one that SIGKILL cannot end: waiting on a device)
            break
        found |= {f"{pid} {_name(pid)}" for pid in left if not is_resource_tracker(pid)}
        _kill(left if time.monotonic() > deadline else {pid for pid in left if not is_resource_tracker(pid)})
        time.sleep(0.05)
    _reap()
    if found:
        log.debug("ended %d process(es) left in the job's tree: %s", len(found), sorted(found)[:20])
    return sorted(found)


def end_processes(pids: set[int], grace_seconds: float = 5.0) -> None:
    """SIGKILL ``pids``, multiprocessing's resource trackers last.

    A resource tracker unlinks the shared memory its processes created and left (vLLM's message queues: one
    pair of files in /dev/shm per engine, 400 MB of address space) once the last of them has ended; killed
    with them, it leaves the files. So the others are killed first and a tracker is given ``grace_seconds`` to
    see them go, clean up and leave by itself.
    """
    trackers = {pid for pid in pids if is_resource_tracker(pid)}
    _kill(pids - trackers)
    deadline = time.monotonic() + grace_seconds
    while trackers and time.monotonic() < deadline:
        trackers = {pid for pid in trackers if alive(pid) and not _zombie(pid)}
        time.sleep(0.05)
    _kill(trackers)


def is_resource_tracker(pid: int) -> bool:
    """Whether ``pid`` is a multiprocessing resource tracker (``python -c 'from multiprocessing.resource_tracker
    import main; main(fd)'``)."""
    import psutil

    try:
        return any("multiprocessing.resource_tracker" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _reap() -> None:
    """Collect every child that has ended (an orphan handed to this subreaper is nobody else's to wait for)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
