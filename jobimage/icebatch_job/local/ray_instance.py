"""A Ray instance of the job's own, on this machine: what only a job without a cluster needs.

A job started without ``RAY_ADDRESS`` (the embedded default: ``make demo``, ``icebatch launch``, the tests)
starts a private Ray instance, and then owns every process of it: each ends with the job, however the job
ends (``own_the_tree``: ``lineage``, ``reaper``, ``shared_memory``). On a RayJob's pod the job connects to
the cluster KubeRay started, and nothing here is imported (``tests/contract/test_architecture.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from icebatch.core.settings import Settings

from icebatch_job.local.lineage import adopt_orphans, end_descendants
from icebatch_job.local.reaper import start_reaper
from icebatch_job.local.shared_memory import unlink_left_segments

log = logging.getLogger(__name__)


def start_local_ray(settings: Settings, *, num_cpus: int | None = None, **kwargs: Any) -> None:
    """``ray.init`` of a new local instance on the loopback interface, with its temp dir under ICEBATCH_HOME,
    every process of it owned by this one (``own_the_tree``); ``kwargs``: ``ray.init``'s others."""
    import ray

    own_the_tree()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private, loopback-only cluster
    log.info("starting Ray (local, 127.0.0.1)")
    ray.init(
        address="local",  # a new instance: never attach to some other cluster found in /tmp/ray
        _temp_dir=ray_temp_dir(settings),
        include_dashboard=False,
        # Logical CPUs, not cores: the engine's bundle takes one, and Ray Data's budget would leave
        # nothing for the (mostly waiting) read and prompt stages on a 2-core machine: a silent hang.
        num_cpus=num_cpus or max(4, 2 * (os.cpu_count() or 2)),
        _node_ip_address="127.0.0.1",
        **kwargs,
    )


def ray_temp_dir(settings: Settings) -> str:
    """Ray's temp dir, under ICEBATCH_HOME.

    Ray puts unix sockets in it, whose paths may not exceed 107 bytes; a deep ICEBATCH_HOME is reached
    through a short symlink in /tmp so that the files still live under the project's folder.
    """
    real = settings.home / "ray"
    real.mkdir(parents=True, exist_ok=True)
    if len(str(real)) <= 40:
        return str(real)
    link = Path("/tmp") / f"icebatch-ray-{hashlib.sha1(str(real).encode()).hexdigest()[:10]}"
    _remove_dangling_links(Path("/tmp"))
    if not link.is_symlink() or link.resolve() != real:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(real, target_is_directory=True)
    return str(link)


def _remove_dangling_links(folder: Path) -> None:
    """The links of homes that are gone (a removed project, a test's temporary home): nothing else cleans them."""
    for old in folder.glob("icebatch-ray-*"):
        with contextlib.suppress(OSError):  # another job's cleanup may have come first
            if old.is_symlink() and not old.exists():
                old.unlink()


_owning: list[bool] = []


def own_the_tree() -> None:
    """Before this process starts a Ray instance: every process of its tree ends with it (once per process).

    Orphans of the tree are handed to this process (a child subreaper) and, at exit, once Ray is shut
    down, whatever is left is killed (``icebatch_job.local.lineage``); a watchdog in a session of its own ends
    what is left if this process is killed without notice (``icebatch_job.local.reaper``).
    """
    if _owning:
        return
    _owning.append(adopt_orphans())
    started = time.time()
    start_reaper(since=started)
    atexit.register(_end_the_tree, started)


def _end_the_tree(started: float) -> None:
    """At exit: Ray shut down as Ray's own exit handler would (it may come later: it was registered when Ray
    was imported), then what is left of the tree ended, then the shared memory its processes left unlinked
    (``icebatch_job.local.shared_memory``)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    end_descendants()
    if left := unlink_left_segments(started):  # every run's (Ray kills the engine's actor): routine, and at exit the
        # terminal is the user's again (`icebatch job run` shows icebatch's own lines there, the rest in its log)
        log.debug("unlinked shared memory the job's processes left: %s", ", ".join(f"/dev/shm/{n}" for n in left))
