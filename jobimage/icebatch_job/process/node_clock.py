"""What a node's kernel says of its start: when it booted and when the container a process runs in started.

``psutil.boot_time`` is ``/proc/stat``'s ``btime``, the host's boot (not namespaced: the same in a container). The
container's start is its PID 1's: in a pod's own PID namespace, the container's first process; on a machine of its
own, the host's init (started at boot). The job reads these on the node its engine runs on, through a Ray task pinned
to that node (``engine_node_clock``), to split the time before its process (``icebatch.core.costs.before_job``).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def node_clock() -> tuple[float, float]:
    """This node's boot and this container's start (Unix seconds); the boot twice where PID 1 cannot be read."""
    import psutil

    booted = psutil.boot_time()
    try:
        return booted, psutil.Process(1).create_time()
    except psutil.Error:
        return booted, booted


def engine_node_clock(timeout: float = 30.0) -> tuple[float, float] | None:
    """``node_clock`` of the GPU node that came up last (the one the job waited for), read there by a Ray task that
    takes no resource the engine needs; None with no GPU node in the cluster (the engine on this machine's CPU) or
    when the nodes do not answer within ``timeout``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gpu_nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU")]
    if not gpu_nodes:
        return None
    read: Any = ray.remote(num_cpus=0)(node_clock)
    pending = [
        read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        for node in gpu_nodes
    ]
    try:
        clocks: list[tuple[float, float]] = ray.get(pending, timeout=timeout)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as e:
        log.info("the GPU nodes' start times were not read (%s): the time before the job is not split", e)
        for task in pending:
            ray.cancel(task, force=True)
        return None
    return max(clocks, key=lambda clock: clock[1])
