"""What a process tree left behind: processes that carry its mark in their environment, shared memory in /dev/shm.

A test starts the process under test with ``{MARK: <a new uuid>}`` in its environment; every process it starts
inherits it (Ray's workers and agents, the engine's processes, whatever their process group), unless it
overwrites its environment block with a long title (setproctitle, as vLLM's processes do).
"""

from __future__ import annotations

from pathlib import Path

MARK = "HYGIENE_MARK"
SHM = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")


def marked(mark: str) -> list[str]:
    """'pid name command line' of every live process (not a zombie) whose environment holds ``mark``."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            name = (entry / "comm").read_text().strip()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:  # gone meanwhile
            continue
        if state != "Z":
            found.append(f"{entry.name} {name} {command}")
    return found


def shared_memory() -> set[str]:
    """The names of the segments in /dev/shm that Python's multiprocessing makes: ``SharedMemory`` (``psm_``, vLLM's
    queues) and named semaphores (``sem.mp-``, its locks under the spawn and forkserver start methods)."""
    return {p.name for prefix in PREFIXES for p in SHM.glob(f"{prefix}*")}
