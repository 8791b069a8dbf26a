"""The launcher's decisions, kept where the embedded default keeps its state: ``$ICEBATCH_HOME/decisions.jsonl``.

On AWS each decision is a log record and metrics (``BacklogRows``, ``Decisions`` ...) in CloudWatch, which the
Grafana dashboard charts. Here the launcher runs in-process (``icebatch launch``, ``invoke``, the demo, the local
bus), and every decision it returns is appended to this file, so that ``icebatch costs --html`` can chart the
backlog over time as the dashboard does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from icebatch.core.jsonl import records
from icebatch.core.settings import ensure_folder

log = logging.getLogger(__name__)

FILE = "decisions.jsonl"


def record_decisions(home: Path, response: dict[str, Any]) -> None:
    """Append the decisions of one launcher response (none when the event was rejected)."""
    decisions = response.get("decisions") or []
    if not decisions:
        return
    ensure_folder(home)
    with (home / FILE).open("a") as f:
        for d in decisions:
            f.write(json.dumps(d, sort_keys=True, default=str) + "\n")


@dataclass(frozen=True)
class BacklogPoint:
    """What one decision saw: a consumer's backlog at a time."""

    consumer: str
    at: datetime
    rows: int
    threshold: int
    decision: str


def backlog_points(home: Path, consumers: Iterable[str], since: datetime) -> list[BacklogPoint]:
    """The backlog each decision since ``since`` saw, oldest first (lines that do not parse are skipped, said)."""
    wanted = set(consumers)
    points = [p for p in _points(home / FILE) if p.consumer in wanted and p.at >= since]
    return sorted(points, key=lambda p: p.at)


def _points(path: Path) -> Iterator[BacklogPoint]:
    def point(d: Any) -> BacklogPoint:
        at = datetime.fromisoformat(d["decided_at"])
        if at.tzinfo is None:
            raise ValueError("decided_at has no time zone")
        return BacklogPoint(str(d["consumer"]), at, int(d["backlog_rows"]), int(d["threshold"]), str(d["decision"]))

    return records(path, point, "a decision")
