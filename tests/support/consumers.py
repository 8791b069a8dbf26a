"""The running example's consumers, as the default consumers file declares them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.settings import Settings


def consumer(settings: Settings, name: str = "triage") -> Consumer:
    return consumer_named(load_consumers(settings), name)


def triage(settings: Settings | None = None) -> Consumer:
    return consumer(settings or Settings(), "triage")


TASKS = Path(__file__).resolve().parents[2] / "functions" / "icebatch" / "consumers" / "tasks"


def consumers_file(folder: Path, *entries: dict[str, Any]) -> Path:
    """A consumers file of these entries (``task`` names a task of the default ones, triage or privacy, or is a task
    file's ``Path``)."""
    import yaml

    def task(entry: dict[str, Any]) -> str:
        given = entry.get("task", "triage")
        return str(given if isinstance(given, Path) else TASKS / f"{given}.json")

    folder.mkdir(parents=True, exist_ok=True)
    listed = [{**e, "task": task(e)} for e in entries]
    path = folder / "consumers.yaml"
    path.write_text(yaml.safe_dump({"consumers": listed}))
    return path
