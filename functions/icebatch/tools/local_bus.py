"""The embedded default's event bus: in-process, wired like the AWS application.

``LocalBus`` applies the same rule patterns as EventBridge (``icebatch.core.rules``, the subset icebatch
uses) and calls the subscribed handlers with the same envelope a Lambda target receives. Every event is
also appended to ``$ICEBATCH_HOME/events.jsonl``; a delivery that fails goes to ``dead-letters.jsonl``
(EventBridge's dead-letter queue stands in for it in AWS). ``local_bus(settings)`` subscribes the
reporter handler, called as Lambda calls it; its notifier prints the report and files it under
``$ICEBATCH_HOME/reports``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from icebatch.core.bus import EventPublisher
from icebatch.core.events import _Detail, envelope
from icebatch.core.rules import PATTERNS, fill, matches
from icebatch.core.settings import Settings, ensure_folder

log = logging.getLogger(__name__)

Subscriber = Callable[[dict[str, Any]], Any]


class LocalBus(EventPublisher):
    def __init__(self, home: Path, rules: list[tuple[Mapping[str, Any], Subscriber]] | None = None) -> None:
        self.home = home
        self.rules = list(rules or [])

    def subscribe(self, pattern: Mapping[str, Any], target: Subscriber) -> None:
        self.rules.append((pattern, target))

    def publish(self, detail: _Detail) -> str:
        event = envelope(detail, event_id=str(uuid.uuid4()), time=datetime.now(UTC))
        self.deliver(event)
        return str(event["id"])

    def deliver(self, event: dict[str, Any]) -> None:
        ensure_folder(self.home)
        with (self.home / "events.jsonl").open("a") as f:
            f.write(json.dumps(event) + "\n")
        for pattern, target in self.rules:
            if not matches(pattern, event):
                continue
            try:
                target(event)
            except Exception as e:  # a failed delivery must not fail the publisher (EventBridge: retry + DLQ)
                log.error("delivery of %s %s failed: %r", event["detail-type"], event["id"], e)
                with (self.home / "dead-letters.jsonl").open("a") as f:
                    f.write(json.dumps({"error": repr(e), "event": event}) + "\n")


def local_bus(settings: Settings) -> LocalBus:
    """A LocalBus under ICEBATCH_HOME with the template's completion/failure -> reporter rule."""
    from icebatch.tools.invoke import invoke

    def reporter(event: dict[str, Any]) -> Any:
        result = invoke("reporter", event, settings, logs_to_stderr=True)
        if result.get("status") in {"rejected", "error"}:
            raise RuntimeError(f"reporter: {result.get('reason')}")
        return result

    bus = LocalBus(settings.home)
    bus.subscribe(fill(PATTERNS["reporter"], {"AWS::StackName": settings.top.deployment}), reporter)
    return bus
