"""GPU instance types the worker may land on: capacity, what Karpenter leaves allocatable, and price.

Karpenter sizes a node's allocatable resources before it launches one, with this formula (EKS AL2023
defaults, ``karpenter.k8s.aws`` v1):

- memory: capacity - 7.5 % VM overhead (``vmMemoryOverheadPercent``) - kube-reserved
  (11 MiB x max pods + 255 MiB) - the eviction threshold (100 MiB);
- CPU: capacity - kube-reserved (6 % of the first core, 1 % of the second, 0.5 % of the next two, 0.25 %
  of the rest).

The worker pod must fit what is left after the DaemonSets every GPU node runs (aws-node, kube-proxy,
the Pod Identity agent, the NVIDIA device plugin, the DCGM exporter, ...): ``DAEMONSET_RESERVE``.
A worker that does not fit an ``xlarge`` makes Karpenter buy the next size up, at a higher price than
the cost report would bill: ``can_host`` keeps the two honest, and the cost rate comes from the
cheapest type that can actually host the worker.

Prices are on-demand USD per hour in us-east-1 (the NodePool is spot-first, so real bills are usually
lower: reports say the rate is an on-demand upper bound). Pass ``ICEBATCH_GPU_HOURLY_RATE`` for
another region or a negotiated price.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MIB = 1024**2
VM_MEMORY_OVERHEAD = 0.075
EVICTION_THRESHOLD_MIB = 100
PRICE_REGION = "us-east-1"


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_mib: int
    gpus: int
    gpu: str
    gpu_memory_gib: int
    max_pods: int  # ENI-based limit of the VPC CNI
    usd_per_hour: float  # on-demand, PRICE_REGION

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("g6.xlarge", 4, 16384, 1, "L4", 24, 58, 0.8048),
        InstanceType("g6.2xlarge", 8, 32768, 1, "L4", 24, 58, 0.9776),
        InstanceType("g6.4xlarge", 16, 65536, 1, "L4", 24, 234, 1.3232),
        InstanceType("g6.12xlarge", 48, 196608, 4, "L4", 96, 234, 4.6016),
        InstanceType("g5.xlarge", 4, 16384, 1, "A10G", 24, 58, 1.006),
        InstanceType("g5.2xlarge", 8, 32768, 1, "A10G", 24, 58, 1.212),
        InstanceType("g5.4xlarge", 16, 65536, 1, "A10G", 24, 234, 1.624),
        InstanceType("g5.12xlarge", 48, 196608, 4, "A10G", 96, 234, 5.672),
        InstanceType("g6e.xlarge", 4, 32768, 1, "L40S", 48, 58, 1.861),
        InstanceType("g6e.2xlarge", 8, 65536, 1, "L40S", 48, 58, 2.24208),
        InstanceType("g6e.12xlarge", 48, 393216, 4, "L40S", 192, 234, 10.49264),
    )
}


# The CPU NodePool's types (the Ray head and the job's submitter): no GPU, on-demand price.
CPU_INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("m7i.large", 2, 8192, 0, "-", 0, 29, 0.1008),
        InstanceType("m6i.large", 2, 8192, 0, "-", 0, 29, 0.096),
        InstanceType("m5.large", 2, 8192, 0, "-", 0, 29, 0.096),
    )
}


@dataclass(frozen=True)
class Resources:
    """A pod's requests: millicores and MiB."""

    cpu_milli: int
    memory_mib: int

    def __str__(self) -> str:
        return f"cpu {self.cpu_milli}m, memory {self.memory_mib}Mi"


# What the DaemonSets of a GPU node request together (aws-node 25m, kube-proxy 100m, eks-pod-identity-agent
# 25m, ebs-csi-node 30m/120Mi, nvidia-device-plugin, dcgm-exporter 100m/512Mi, with room to spare).
DAEMONSET_RESERVE = Resources(cpu_milli=350, memory_mib=1024)


def kube_reserved_cpu_milli(vcpus: int) -> float:
    steps = ((1, 0.06), (1, 0.01), (2, 0.005))
    reserved, left = 0.0, vcpus
    for cores, share in steps:
        take = min(left, cores)
        reserved += take * 1000 * share
        left -= take
    return reserved + left * 1000 * 0.0025


def allocatable(t: InstanceType) -> Resources:
    """What Karpenter expects the kubelet to offer pods on a node of this type."""
    memory = (
        t.memory_mib - math.ceil(t.memory_mib * VM_MEMORY_OVERHEAD) - (11 * t.max_pods + 255) - EVICTION_THRESHOLD_MIB
    )
    cpu = t.vcpus * 1000 - math.ceil(kube_reserved_cpu_milli(t.vcpus))
    return Resources(cpu_milli=cpu, memory_mib=memory)


def can_host(t: InstanceType, requests: Resources, gpus: int) -> bool:
    """Whether one worker pod with these requests (and GPUs) fits a node of this type."""
    free = allocatable(t)
    return (
        t.gpus >= gpus
        and requests.cpu_milli + DAEMONSET_RESERVE.cpu_milli <= free.cpu_milli
        and requests.memory_mib + DAEMONSET_RESERVE.memory_mib <= free.memory_mib
    )


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {
    None: 1,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "Ki": 1024,
    "Mi": MIB,
    "Gi": 1024**3,
    "Ti": 1024**4,
}


def parse_cpu(quantity: str) -> int:
    """A Kubernetes CPU quantity (``3``, ``3500m``) in millicores."""
    m = _QUANTITY.match(quantity)
    if not m or m.group(2) not in (None, "m"):
        raise ValueError(f"{quantity!r} is not a CPU quantity (e.g. 3 or 3500m)")
    value = float(m.group(1))
    return int(value if m.group(2) == "m" else value * 1000)


def parse_memory(quantity: str) -> int:
    """A Kubernetes memory quantity (``12Gi``, ``12288Mi``, ``13G``) in MiB (rounded up)."""
    m = _QUANTITY.match(quantity)
    if not m or m.group(2) == "m":
        raise ValueError(f"{quantity!r} is not a memory quantity (e.g. 12Gi or 12288Mi)")
    return math.ceil(float(m.group(1)) * _FACTORS[m.group(2)] / MIB)


@dataclass(frozen=True)
class BillingRate:
    """The hourly rate a report bills per GPU worker, and where it comes from."""

    usd_per_hour: float
    instance_type: str | None  # the type assumed (None: a configured rate)
    source: str  # e.g. "g6.xlarge on-demand (us-east-1)" or "ICEBATCH_GPU_HOURLY_RATE"


def cheapest_host(types: list[str], requests: Resources, gpus: int) -> InstanceType | None:
    """The cheapest allowed type that can host the worker (None when none can)."""
    fitting = [INSTANCE_TYPES[n] for n in types if n in INSTANCE_TYPES and can_host(INSTANCE_TYPES[n], requests, gpus)]
    return min(fitting, key=lambda t: t.usd_per_hour, default=None)


def billing_rate(types: list[str], requests: Resources, gpus: int, configured: float | None) -> BillingRate:
    """``configured`` when given, else the on-demand price of the cheapest type that can host the worker."""
    host = cheapest_host(types, requests, gpus)
    if configured is not None:
        return BillingRate(configured, host.name if host else None, "ICEBATCH_GPU_HOURLY_RATE")
    if host is None:
        raise ValueError(
            f"none of the GPU instance types {types} can host a worker with {requests} and {gpus} GPU(s) "
            f"(known types: {', '.join(INSTANCE_TYPES)})"
        )
    return BillingRate(host.usd_per_hour, host.name, f"{host.name} on-demand ({PRICE_REGION})")
