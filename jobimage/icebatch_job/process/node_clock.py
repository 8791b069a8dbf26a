"""What a node's kernel says of its start: when it booted and when the container a process runs in started.

``psutil.boot_time`` is ``/proc/stat``'s ``btime``, the host's boot (not namespaced: the same in a container). The
container's start is its PID 1's: in a pod's own PID namespace, the container's first process; on a machine of its
own, the host's init (started at boot). The job reads these on the node its engine runs on, through a Ray task pinned
to that node (``engine_node_clock``; ``on_gpu_nodes``), to split the time before its process
(``icebatch.core.costs.before_job``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def node_clock() -> tuple[float, float]:
    """This node's boot and this container's start (Unix seconds); the boot twice where PID 1 cannot be read."""
    import psutil

    booted = psutil.boot_time()
    try:
        return booted, psutil.Process(1).create_time()
    except psutil.Error:
        return booted, booted


def engine_node_clock(timeout: float = 30.0) -> tuple[float, float] | None:
    """``node_clock`` of the GPU node that came up last (the one the job waited for); None with no GPU node in the
    cluster (the engine on this machine's CPU) or when the nodes do not answer within ``timeout``."""
    clocks = on_gpu_nodes(node_clock, timeout=timeout)
    return max(clocks, key=lambda clock: clock[1]) if clocks else None


def on_gpu_nodes(fn: Callable[..., T], *args: Any, timeout: float = 30.0) -> list[T] | None:
    """``fn(*args)`` on each GPU node of the cluster, by a Ray task pinned there that takes no resource the engine
    needs: their answers; None with no GPU node (the engine on this machine's CPU); [] when the nodes do not answer
    within ``timeout``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gpu_nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU")]
    if not gpu_nodes:
        return None
    task: Any = ray.remote(num_cpus=0)(fn)
    pending = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)
        for node in gpu_nodes
    ]
    try:
        answers: list[T] = ray.get(pending, timeout=timeout)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as e:
        log.info("the GPU nodes did not answer %s (%s)", getattr(fn, "__name__", fn), e)
        for each in pending:
            ray.cancel(each, force=True)
        return []
    return answers
