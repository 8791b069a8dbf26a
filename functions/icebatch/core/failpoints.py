"""Fault injection: pause at a named point so that a test, or a chaos drill, can kill the process there.

``ICEBATCH_FAILPOINT=<point>[@<n>]`` (``Settings.progress.failpoint``; the job arms it with ``arm``, in
its driver and in its read tasks) makes the n-th arrival (default: the first) of a process at ``<point>``
announce itself and then sleep until the process is killed or signalled. The announcement is a line on
stderr and a file ``<home>/failpoints/<point>@<n>`` holding the process id, so the killer knows the
moment has come. Unarmed, ``failpoint()`` is one comparison.

Where the job can be paused (each is a place where a kill must lose nothing but unfinished work):
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

POINTS = {
    "read": "a read task is about to read a source data file (in a Ray worker)",
    "chunk.buffered": "finished result rows are held by the job, not yet written",
    "chunk.written": "a chunk's data files are written, not yet committed",
    "commit.before": "the commit is about to be sent to the catalog",
    "commit.after": "the catalog accepted the commit; the job has not yet seen the answer",
    "chunk.between": "a chunk is committed; the job has not yet taken the next rows",
}
__doc__ = (__doc__ or "") + "".join(f"\n- ``{k}``: {v}" for k, v in POINTS.items()) + "\n"
_hits: Counter[str] = Counter()
_armed: tuple[str, int, Path] | None = None


def arm(spec: str | None, home: Path) -> None:
    """Arm this process's failpoint (``None``: disarm). ``spec`` is validated by the settings."""
    global _armed
    if spec is None:
        _armed = None
        return
    name, _, nth = spec.partition("@")
    _armed = (name, int(nth or 1), home)


def failpoint(point: str) -> None:
    """Pause here if the armed failpoint names this point and this is the arrival it names."""
    if _armed is None or _armed[0] != point:
        return
    _hits[point] += 1
    if _hits[point] != _armed[1]:
        return
    marker = _armed[2] / "failpoints" / f"{point}@{_hits[point]}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    print(
        f"icebatch: failpoint {point}@{_hits[point]} reached (pid {os.getpid()}); waiting to be killed",
        file=sys.stderr,
        flush=True,
    )
    while True:
        time.sleep(0.05)
