"""Karpenter's view of a GPU node, and the rate a report bills."""

from __future__ import annotations

import pytest
from icebatch.core.costs.instances import (
    INSTANCE_TYPES,
    Resources,
    allocatable,
    billing_rate,
    can_host,
    parse_cpu,
    parse_memory,
)
from icebatch.core.errors import ConfigError
from icebatch.core.settings import Settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "cpu", "memory"),
    [("g6.xlarge", 3920, 14162), ("g5.xlarge", 3920, 14162), ("g6.2xlarge", 7910, 29317), ("g6e.xlarge", 3920, 29317)],
)
def test_allocatable_follows_karpenters_formula(name: str, cpu: int, memory: int) -> None:
    # memory: capacity - 7.5 % - (11 MiB x max pods + 255 MiB) - 100 MiB; cpu: capacity - kube-reserved
    assert allocatable(INSTANCE_TYPES[name]) == Resources(cpu_milli=cpu, memory_mib=memory)


def test_a_worker_fits_only_with_room_for_the_daemonsets() -> None:
    xlarge = INSTANCE_TYPES["g6.xlarge"]
    assert can_host(xlarge, Resources(3000, 12 * 1024), gpus=1)
    assert not can_host(xlarge, Resources(3000, 14 * 1024), gpus=1)  # the seed's 14Gi: Karpenter buys a 2xlarge
    assert not can_host(xlarge, Resources(3700, 12 * 1024), gpus=1)
    assert not can_host(xlarge, Resources(1000, 1024), gpus=2)


@pytest.mark.parametrize(("text", "milli"), [("3", 3000), ("3500m", 3500), ("0.5", 500)])
def test_cpu_quantities(text: str, milli: int) -> None:
    assert parse_cpu(text) == milli


@pytest.mark.parametrize(("text", "mib"), [("12Gi", 12288), ("12288Mi", 12288), ("13G", 12398), ("1Ti", 1048576)])
def test_memory_quantities(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


@pytest.mark.parametrize("bad", ["", "3 cpus", "12GB", "-1", "12gi"])
def test_bad_quantities_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_memory(bad)


def test_the_rate_is_the_cheapest_type_that_hosts_the_worker_unless_configured() -> None:
    types = ["g5.xlarge", "g6.xlarge", "g6.2xlarge"]
    assert billing_rate(types, Resources(3000, 12288), 1, None).instance_type == "g6.xlarge"
    bigger = billing_rate(types, Resources(3000, 20480), 1, None)
    assert (bigger.instance_type, bigger.usd_per_hour, bigger.source) == (
        "g6.2xlarge",
        0.9776,
        "g6.2xlarge on-demand (us-east-1)",
    )
    configured = billing_rate(types, Resources(3000, 12288), 1, 0.5)
    assert (configured.usd_per_hour, configured.source) == (0.5, "ICEBATCH_GPU_HOURLY_RATE")
    with pytest.raises(ValueError, match="can host"):
        billing_rate(["g6.xlarge"], Resources(3000, 20480), 1, None)


def test_a_kuberay_deployment_whose_worker_fits_no_allowed_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ICEBATCH_WORKER_MEMORY"):
        Settings.from_env(
            {
                "ICEBATCH_BACKEND": "kuberay",
                "ICEBATCH_EKS_CLUSTER": "c",
                "ICEBATCH_GPU_INSTANCE_TYPES": '["g6.xlarge"]',
                "ICEBATCH_WORKER_MEMORY": "20Gi",
            }
        )
    with pytest.raises(ConfigError, match="ICEBATCH_WORKER_MEMORY"):
        Settings.from_env({"ICEBATCH_WORKER_MEMORY": "lots"})
