"""vLLM's shared-memory queues and locks leave no file in /dev/shm, however the job ends.

vLLM's engine core and its model worker talk through shared-memory ring buffers (``multiprocessing``'s
``SharedMemory``: a 160 MB and a 240 MB segment per engine), each created by its writer, which unlinks its
name when the queue is collected. A process killed never collects it, and Ray ends the engine's actor by
killing it at every run's end: each run would leave its pair in /dev/shm, whatever ended the job. So with
``multiprocessing``'s named semaphores (``sem.mp-*``, 32 bytes each, its locks under the spawn and forkserver
start methods), which its resource tracker unlinks at exit unless it is killed with the rest of the tree.

The job does not reach into vLLM for this. Once its processes are gone (at its exit, after Ray's shutdown; or,
when it is killed without notice, by its watchdog, ``icebatch_job.local.reaper``), it unlinks the segments
left since it started: in /dev/shm, with one of ``multiprocessing``'s prefixes, this user's, changed at or after the
job's start (waited for until ``SETTLE_SECONDS`` old), and mapped by no live process (a segment in use is mapped by
its writer from its creation on, and by each reader from its opening). Another job's live queues are mapped;
only what no process uses any more goes.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")  # multiprocessing's SharedMemory's and named semaphores' names
SETTLE_SECONDS = 1.0  # a segment younger than this may be between its creation and its writer's mmap


def mapped_segments() -> set[str]:
    """The names of the /dev/shm segments some live process maps (psutil; those it may not read are skipped)."""
    import psutil

    names: set[str] = set()
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            for m in p.memory_maps(grouped=True):
                path = m.path.removesuffix(" (deleted)")
                if path.startswith(f"{SHM}/"):
                    names.add(path.rsplit("/", 1)[1])
    return names


def unlink_left_segments(since: float, *, folder: Path = SHM) -> list[str]:
    """Unlink the segments left since ``since`` (a ``time.time()``: the job's start) by the module docstring's
    rule; their names. A segment changed less than ``SETTLE_SECONDS`` ago is waited for first."""
    uid = os.getuid()
    candidates: dict[Path, float] = {}
    for path in (path for prefix in PREFIXES for path in folder.glob(f"{prefix}*")):
        with contextlib.suppress(OSError):  # gone meanwhile
            st = path.lstat()
            if st.st_uid == uid and st.st_mtime >= since and path.is_file():
                candidates[path] = st.st_mtime
    if not candidates:
        return []
    time.sleep(max(0.0, max(candidates.values()) + SETTLE_SECONDS - time.time()))
    in_use = mapped_segments()
    gone = []
    for path in sorted(candidates):
        if path.name not in in_use:
            with contextlib.suppress(OSError):  # another job's end came first
                path.unlink()
                gone.append(path.name)
    return gone
