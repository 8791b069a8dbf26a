"""vLLM's shared-memory queues leave no file in /dev/shm, however the job ends.

The engine core and its model worker talk through shared-memory ring buffers (a pair per engine, 160 and 240 MB
of address space), each created by its writer and opened by name by its readers; the writer unlinks the name
when its queue is collected. A process killed (SIGKILL, a kill of its parent: every way a job ends but a clean
engine shutdown, including Ray's end of the stage's actor) never collects it, and each run left its pair in
/dev/shm. Two guards:

- the writer unlinks the name as soon as every reader has opened it (``wait_until_ready``: a reader subscribes
  only after opening the buffer), as a file is unlinked once opened: the memory stays mapped while a process
  uses it and the kernel frees it after the last one (``unlink_shared_memory_once_attached``);
- before that moment (the engine starting), a job ended then would still leave the name: each name is recorded
  when created, in a file the job's process made (``ICEBATCH_SHM_RECORD``, inherited by its whole tree), and
  what is left of them is unlinked once the job's processes are gone: by the job at exit, or, when it is killed
  without notice (SIGKILL, alone or with its group), by its watchdog (``icebatch_job.process.reaper``), which
  outlives it for that (``record_shared_memory``, ``unlink_recorded_shared_memory``:
  ``icebatch_job.process.runtime.own_the_tree``);
- and should the watchdog die too, the next job sweeps the records no process holds any more: the job's process
  holds an ``flock`` on its record while it lives, which the kernel lets go with the last process holding it
  (``sweep_abandoned_records``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from pathlib import Path
from typing import Any

RECORD_VARIABLE = "ICEBATCH_SHM_RECORD"
SHM = Path("/dev/shm")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}")  # a shared-memory name as multiprocessing makes them


PREFIX, SUFFIX = "icebatch-shm-", ".names"
_held: list[int] = []  # the record's descriptor, locked while this process (or a forked child) lives


def record_shared_memory() -> Path:
    """Where this process's tree records the shared memory it creates (set in the environment it hands on),
    locked for as long as this process, or a child forked with the lock, lives."""
    fd, path = tempfile.mkstemp(prefix=PREFIX, suffix=SUFFIX)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held.append(fd)  # never closed: the kernel releases the lock when the last holder is gone
    os.environ[RECORD_VARIABLE] = path
    return Path(path)


def sweep_abandoned_records(folder: Path | None = None) -> list[str]:
    """Unlink the names of records no process holds (their job and its watchdog were killed), and the records;
    the names unlinked. A record held by a live job, this one's included, is left alone."""
    left: list[str] = []
    for record in Path(folder or tempfile.gettempdir()).glob(f"{PREFIX}*{SUFFIX}"):
        try:
            fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its job lives
            os.close(fd)
            continue
        try:
            left += unlink_recorded_shared_memory(record)
        finally:
            os.close(fd)
    return left


def unlink_recorded_shared_memory(record: Path) -> list[str]:
    """Unlink the recorded names still in /dev/shm (their processes are gone), and the record; the names."""
    try:
        names = [n for n in record.read_text().split() if NAME.fullmatch(n)]  # a name, never a path
    except OSError:
        return []
    left = []
    for name in names:
        with contextlib.suppress(OSError):  # gone already (unlinked once attached), or not ours to remove
            (SHM / name).unlink()
            left.append(name)
    with contextlib.suppress(OSError):
        record.unlink()
    return left


def _record(name: str) -> None:
    path = os.environ.get(RECORD_VARIABLE)
    if not path:
        return
    with contextlib.suppress(OSError), open(path, "a") as f:  # one short append: not interleaved
        f.write(name.lstrip("/") + "\n")


def _failpoint() -> None:
    """The job's failpoint ``engine.queues``, armed here from the environment (an engine process has no settings)."""
    from icebatch.core.failpoints import arm, failpoint

    spec = os.environ.get("ICEBATCH_FAILPOINT")
    if spec and spec.partition("@")[0] == "engine.queues":
        arm(spec, Path(os.environ.get("ICEBATCH_HOME", ".icebatch")))
        failpoint("engine.queues")


def unlink_shared_memory_once_attached() -> None:
    """In the engine's processes (``icebatch_job.process.engine_preload``): each queue's name recorded when its
    writer creates it, and unlinked once every reader has opened it."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    original_init, original_wait = MessageQueue.__init__, MessageQueue.wait_until_ready
    if getattr(original_wait, "unlinks_once_attached", False):
        return

    def created(self: Any) -> Any:
        buffer = getattr(self, "buffer", None)
        if getattr(self, "_is_writer", False) and buffer is not None and getattr(buffer, "is_creator", False):
            return buffer
        return None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if (buffer := created(self)) is not None:
            _record(buffer.shared_memory.name)

    def wait_until_ready(self: Any) -> None:
        if created(self) is not None:
            _failpoint()
        original_wait(self)
        if (buffer := created(self)) is not None:
            buffer.shared_memory.unlink()  # the name (and the resource tracker's record); the memory stays
            buffer.is_creator = False  # its collection closes its mapping only

    wait_until_ready.unlinks_once_attached = True  # type: ignore[attr-defined]
    MessageQueue.__init__ = __init__  # type: ignore[method-assign]
    MessageQueue.wait_until_ready = wait_until_ready  # type: ignore[method-assign]
