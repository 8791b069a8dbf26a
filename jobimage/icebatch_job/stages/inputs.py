"""What a pipeline is built from: each run's rows, task and row window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from icebatch.core.task import TaskSpec

if TYPE_CHECKING:
    import ray.data

    from icebatch_job.commit.window import RowWindow


@dataclass(frozen=True)
class RunSource:
    """One run's way into the engine: its rows, its task and its row window. A shared job (``icebatch_job.shared``)
    has one per run, each numbered (``member``) so that the driver can tell their answers apart."""

    dataset: ray.data.Dataset
    task: TaskSpec
    window: RowWindow | None
    member: int | None = None
