"""Where the time before a job's process went, from the launch and the node's kernel (core.costs.before_job)."""

from __future__ import annotations

import pytest
from icebatch.core.costs.before_job import BeforeJob, split

pytestmark = pytest.mark.unit

LAUNCH = 1_796_600_000.0


@pytest.mark.parametrize(
    ("booted", "container", "started", "parts"),
    [
        # a node Karpenter started for the job: 70 s to its boot, 110 s to the container (the image), 20 s of Ray
        (LAUNCH + 70, LAUNCH + 180, LAUNCH + 200, (200, 70, 110, 20)),
        # a node that was up, whose container was started for the job: no node span
        (LAUNCH - 3600, LAUNCH + 45, LAUNCH + 60, (60, 0, 45, 15)),
        # a node and a container both up before the launch (a pod that was running): all of it is Ray's
        (LAUNCH - 3600, LAUNCH - 60, LAUNCH + 12, (12, 0, 0, 12)),
        # clocks of two machines: a container that seems to start after the job's process is clamped into the span
        (LAUNCH + 30, LAUNCH + 95, LAUNCH + 90, (90, 30, 60, 0)),
        # a container that seems to start before its node booted: its image span is 0, not negative
        (LAUNCH + 30, LAUNCH + 29, LAUNCH + 40, (40, 30, 0, 10)),
    ],
)
def test_the_span_is_cut_at_the_boot_and_the_containers_start_and_adds_up(
    booted: float, container: float, started: float, parts: tuple[float, float, float, float]
) -> None:
    before = split(LAUNCH, started, booted, container)
    assert (before.seconds, before.node_seconds, before.image_seconds, before.ray_seconds) == parts
    assert before.node_seconds + before.image_seconds + before.ray_seconds == before.seconds  # type: ignore[operator]


def test_attempts_add_up_and_a_part_measured_in_neither_stays_unmeasured() -> None:
    first, second = BeforeJob(200, 70, 110), BeforeJob(60, 0, 45)
    assert first + second == BeforeJob(260, 70, 155)
    assert (first + second).ray_seconds == 35
    assert BeforeJob(95) + BeforeJob(5) == BeforeJob(100)
    assert (BeforeJob(95) + BeforeJob(5)).ray_seconds is None
