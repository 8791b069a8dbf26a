"""Where the time before a job's process went: the GPU node, its joining and the image pull, the Ray cluster.

The job knows when the launcher submitted it (``ICEBATCH_JOB_LAUNCHED_AT``) and when its own process started; the
node the engine runs on knows, from its kernel, when it booted (``btime``: the host's, also in a container) and when
its container started (PID 1 of the container's PID namespace). Three spans follow, each what one cut shortens:

- **node**: the launch to the node's boot: Karpenter's decision and the instance's start (0 for a node already up);
- **image**: the boot to the container's start: the node joining the cluster and the job image's pull (what an image
  cache on the node's volume cuts);
- **ray**: the container's start to the job's process: Ray's start on the node, the head's, the submission.

Clocks of two machines differ by their NTP error (milliseconds on EC2); each instant is clamped into the span it
bounds, so that the three always add up to the whole.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BeforeJob:
    """The launch to the job's process (``seconds``), and where it went (None: not measured)."""

    seconds: float = 0.0
    node_seconds: float | None = None
    image_seconds: float | None = None

    @property
    def ray_seconds(self) -> float | None:
        if self.node_seconds is None or self.image_seconds is None:
            return None
        return max(0.0, self.seconds - self.node_seconds - self.image_seconds)

    def __add__(self, other: BeforeJob) -> BeforeJob:
        """Two attempts' (a resumed run pays each); a part measured in neither stays unmeasured."""

        def plus(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        return BeforeJob(
            self.seconds + other.seconds,
            plus(self.node_seconds, other.node_seconds),
            plus(self.image_seconds, other.image_seconds),
        )


def split(launched_at: float, started_at: float, booted_at: float, container_started_at: float) -> BeforeJob:
    """The span from ``launched_at`` to ``started_at`` (the job's process), cut at the node's boot and at its
    container's start (Unix seconds, each clamped into the span: a node up before the launch has no node span)."""
    end = max(launched_at, started_at)
    node_up = min(max(booted_at, launched_at), end)
    container = min(max(container_started_at, node_up), end)
    return BeforeJob(end - launched_at, node_up - launched_at, container - node_up)
