"""Where jobs run: a small port with two adapters.

- ``kuberay``: a RayJob custom resource on EKS (the production path, ``icebatch.control.backends.kuberay``).
- ``local``: this machine: in the launcher's process (the demo) or a local Ray cluster's job API. It is
  part of the tooling (``icebatch.tools.local_backend``), loaded by name, which the Lambda bundle does
  not carry.

``load_backend(settings)`` imports the chosen adapter lazily and says what is missing when it cannot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icebatch.core.bus import load_adapter
from icebatch.core.errors import ConfigError

if TYPE_CHECKING:
    from icebatch.control.jobs import JobState
    from icebatch.control.rayjob import JobSpec
    from icebatch.core.settings import Settings

LOCAL_BACKEND = "icebatch.tools.local_backend:LocalBackend"


@dataclass(frozen=True)
class Submission:
    name: str
    created: bool  # False: a job of that name already existed (409 AlreadyExists)
    detail: str = ""


class JobBackend(ABC):
    """What the launcher and the reconciler need from a place that runs jobs."""

    @abstractmethod
    def list_jobs(self, deployment: str) -> list[JobState]:
        """Jobs of this deployment (every consumer, any state)."""

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
    if settings.top.backend == "kuberay":
        try:
            from icebatch.control.backends.kuberay import KubeRayBackend
        except ImportError as e:
            raise ConfigError(f"the kuberay backend needs `{e.name}`: install icebatch[lambda]") from e
        return KubeRayBackend.from_settings(settings, **kwargs)
    backend: JobBackend = load_adapter(LOCAL_BACKEND, "the local backend (ICEBATCH_BACKEND=local)")(settings, **kwargs)
    return backend
