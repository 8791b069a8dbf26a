"""Where jobs run: a small port with two adapters.

- ``kuberay``: a RayJob custom resource on EKS (the production path).
- ``local``: this machine: in the launcher's process (the demo) or a local Ray cluster's job API.

``load_backend(settings)`` imports the chosen adapter lazily and says which extra to install when its
dependencies are missing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icebatch.errors import ConfigError

if TYPE_CHECKING:
    from icebatch.rayjob import JobSpec, JobState
    from icebatch.settings import Settings


@dataclass(frozen=True)
class Submission:
    name: str
    created: bool  # False: a job of that name already existed (409 AlreadyExists)
    detail: str = ""


class JobBackend(ABC):
    """What the launcher and the reconciler need from a place that runs jobs."""

    kind: str

    @abstractmethod
    def list_jobs(self, consumer: str) -> list[JobState]:
        """Jobs of this consumer (any state)."""

    @abstractmethod
    def submit(self, manifest: dict[str, Any], spec: JobSpec) -> Submission:
        """Create the job; an existing job of the same name is not an error (``created=False``)."""

    def start(self, spec: JobSpec) -> str | None:
        """Run a created job where the backend itself runs it (in-process); returns a status note."""
        return None

    @abstractmethod
    def annotate(self, name: str, annotations: dict[str, str]) -> None:
        """Record facts on a job (e.g. that its failure was reported)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove a finished job's record."""


def load_backend(settings: Settings, **kwargs: Any) -> JobBackend:
    if settings.backend == "kuberay":
        try:
            from icebatch.backends.kuberay import KubeRayBackend
        except ImportError as e:
            raise ConfigError(f"the kuberay backend needs `{e.name}`: install icebatch[lambda]") from e
        return KubeRayBackend.from_settings(settings, **kwargs)
    from icebatch.backends.local import LocalBackend

    return LocalBackend(settings, **kwargs)
