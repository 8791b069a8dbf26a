"""The event-publisher port: EventBridge in AWS, an in-process bus in the embedded default.

``LocalBus`` applies the same rule patterns as EventBridge (the subset icebatch's rules use) and calls
the subscribed handlers with the same envelope a Lambda target receives. Every event is also appended
to ``$ICEBATCH_HOME/events.jsonl``; a delivery that fails goes to ``dead-letters.jsonl`` (EventBridge's
DLQ stands in for it in AWS).
"""

from __future__ import annotations

import json
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icebatch.errors import TransientError
from icebatch.events import EVENT_SOURCE, _Detail, envelope

if TYPE_CHECKING:
    from icebatch.settings import Settings

log = logging.getLogger(__name__)

Subscriber = Callable[[dict[str, Any]], Any]


class EventPublisher(ABC):
    @abstractmethod
    def publish(self, detail: _Detail) -> str:
        """Publish one event; returns its id."""


class EventBridgePublisher(EventPublisher):
    def __init__(self, client: Any, bus_name: str) -> None:
        self.client = client
        self.bus_name = bus_name

    def publish(self, detail: _Detail) -> str:
        entry = {
            "Source": EVENT_SOURCE,
            "DetailType": detail.detail_type,
            "Detail": detail.model_dump_json(),
            "EventBusName": self.bus_name,
        }
        response = self.client.put_events(Entries=[entry])
        result = response["Entries"][0]
        if response.get("FailedEntryCount") or "EventId" not in result:
            raise TransientError(
                f"EventBridge rejected the {detail.detail_type!r} event: {result.get('ErrorCode')} "
                f"{result.get('ErrorMessage')}"
            )
        return str(result["EventId"])


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
        self.home.mkdir(parents=True, exist_ok=True)
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


def load_publisher(settings: Settings, *, client: Any = None) -> EventPublisher:
    """EventBridge when ICEBATCH_EVENT_BUS names a bus, else the local bus (reporter subscribed)."""
    if settings.event_bus == "local":
        from icebatch.local_wiring import local_bus

        return local_bus(settings)
    if client is None:
        import boto3

        client = boto3.client("events", region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url)
    return EventBridgePublisher(client, settings.event_bus)


# ---------------------------------------------------------------------------------------------------
# EventBridge pattern matching (the subset icebatch's rules use)
# ---------------------------------------------------------------------------------------------------
def matches(pattern: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """Whether ``event`` matches an EventBridge ``pattern``.

    Supported: nested objects, lists of allowed values, ``{"prefix": ...}``, ``{"suffix": ...}``,
    ``{"anything-but": ...}``, ``{"exists": bool}``, and ``{"wildcard": ...}`` with ``*``.
    """
    for key, expected in pattern.items():
        present = isinstance(event, Mapping) and key in event
        value = event.get(key) if present else None
        if isinstance(expected, Mapping):
            if not present or not isinstance(value, Mapping) or not matches(expected, value):
                return False
            continue
        if not isinstance(expected, list):
            raise ValueError(f"pattern value for {key!r} must be a list or an object, got {expected!r}")
        if not _match_any(expected, value, present):
            return False
    return True


def _match_any(options: list[Any], value: Any, present: bool) -> bool:
    values = value if isinstance(value, list) else [value]
    for option in options:
        if isinstance(option, Mapping):
            if "exists" in option:
                if bool(option["exists"]) == present:
                    return True
                continue
            if not present:
                continue
            if any(_match_operator(option, v) for v in values):
                return True
        elif present and option in values:
            return True
    return False


def _match_operator(option: Mapping[str, Any], value: Any) -> bool:
    import fnmatch

    if "prefix" in option:
        return isinstance(value, str) and value.startswith(option["prefix"])
    if "suffix" in option:
        return isinstance(value, str) and value.endswith(option["suffix"])
    if "wildcard" in option:
        return isinstance(value, str) and fnmatch.fnmatchcase(value, option["wildcard"])
    if "anything-but" in option:
        excluded = option["anything-but"]
        excluded = excluded if isinstance(excluded, list) else [excluded]
        return value not in excluded
    raise ValueError(f"unsupported pattern operator {dict(option)!r}")
