"""The event-publisher port: EventBridge in AWS; in the embedded default, the local bus (tooling).

``load_publisher(settings)`` picks the adapter: ``ICEBATCH_EVENT_BUS`` names an EventBridge bus, or is
``local`` — the in-process bus of ``icebatch.tools.local_bus``, loaded by name (like pyiceberg's
``py-io-impl``): it is part of the tooling, which neither the Lambda bundle nor the job image carries.
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from icebatch.core.errors import ConfigError, TransientError
from icebatch.core.events import EVENT_SOURCE, _Detail

if TYPE_CHECKING:
    from icebatch.core.settings import Settings

log = logging.getLogger(__name__)
LOCAL_BUS = "icebatch.tools.local_bus:local_bus"
JOB_PRINTED_ITS_REPORT: ContextVar[bool] = ContextVar("icebatch_job_printed_its_report", default=False)


@contextmanager
def report_printed_by_the_job() -> Iterator[None]:
    """While a job that prints its own completion report runs (``python -m icebatch_job run`` on a terminal), a
    local reporter delivering that report in the same process files it and says where, not printing it again."""
    token = JOB_PRINTED_ITS_REPORT.set(True)
    try:
        yield
    finally:
        JOB_PRINTED_ITS_REPORT.reset(token)


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


def load_adapter(path: str, what: str) -> Any:
    """``module:attribute``, imported on demand; ConfigError when the module is not installed here."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ConfigError(
            f"{what} ({module}) is part of icebatch's local tooling, which this package does not carry "
            "(the Lambda bundle and the job image do not): configure an AWS adapter instead"
        ) from e


def load_publisher(settings: Settings, *, client: Any = None) -> EventPublisher:
    """EventBridge when ICEBATCH_EVENT_BUS names a bus, else the local bus (reporter subscribed)."""
    if settings.aws.event_bus == "local":
        publisher: EventPublisher = load_adapter(LOCAL_BUS, "the local event bus (ICEBATCH_EVENT_BUS=local)")(settings)
        return publisher
    if client is None:
        from icebatch.core.aws_clients import aws_client

        client = aws_client("events", settings)
    return EventBridgePublisher(client, settings.aws.event_bus)
