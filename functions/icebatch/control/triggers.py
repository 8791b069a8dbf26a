"""What woke the launcher up, parsed with pydantic models (Powertools' parser), never by hand.

Accepted shapes:

- ``schedule``: EventBridge Scheduler's input (``{"trigger": "schedule", ...}``, what the template's
  ``ScheduleV2`` passes) or a classic scheduled rule (``"detail-type": "Scheduled Event"``).
- ``append``: ``Glue Data Catalog Table State Change`` for the source table, or S3 ``Object Created``
  (via EventBridge) for a ``.metadata.json`` under the source table's ``metadata/`` prefix.
- ``manual``: ``{"action": "launch", "force": false, "dry_run": true}`` from ``sam local invoke`` or
  the CLI.
- ``append`` too: ``Batch Job Deferred`` from the job (source ``icebatch``), for its consumer only: a run given
  no model found rows whose content changed, and its job has ended (whatever its RayJob's status says yet).

Anything else raises InvalidEventError (permanent: logged, counted, not retried). The models are strict
(``"force": "yes"`` or ``1`` is not a boolean) and messages quote the input only in summary
(``icebatch.core.untrusted``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser import ValidationError, parse
from aws_lambda_powertools.utilities.parser.models import (
    EventBridgeModel,
    S3EventNotificationEventBridgeModel,
)
from pydantic import BaseModel, ConfigDict, Field

from icebatch.core.errors import InvalidEventError
from icebatch.core.events import EVENT_SOURCE, BatchJobDeferred
from icebatch.core.rules import GLUE_APPEND_CHANGES, GLUE_DETAIL_TYPE
from icebatch.core.untrusted import CONSUMER_NAME, summarize, validation_summary

TriggerKind = Literal["schedule", "append", "manual"]


class SchedulerInput(BaseModel):
    """The input the template's EventBridge Scheduler schedule passes to the launcher."""

    model_config = ConfigDict(extra="forbid", strict=True)
    trigger: Literal["schedule"]
    schedule: str = Field(
        default="nightly", max_length=64, pattern=r"^[A-Za-z0-9._-]+$", description="Name of the schedule, for the log"
    )


class ManualInvoke(BaseModel):
    """``sam local invoke -e sam/events/manual.json`` and ``icebatch launch``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    action: Literal["launch"]
    force: bool = Field(default=False, description="Launch even below the threshold (never beside an active job)")
    dry_run: bool = Field(default=False, description="Decide and build the manifest, submit nothing")
    as_trigger: Literal["schedule", "append", "manual"] = Field(
        default="manual", description="Evaluate as if this trigger had fired (the CLI's --trigger)"
    )
    consumer: str | None = Field(
        default=None, pattern=CONSUMER_NAME, description="Evaluate only this consumer (default: all)"
    )


class GlueTableChangeDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    database_name: str = Field(alias="databaseName")
    table_name: str = Field(alias="tableName")
    type_of_change: str = Field(alias="typeOfChange")
    changed_partitions: list[str] = Field(default_factory=list, alias="changedPartitions")


class GlueTableChangeEvent(EventBridgeModel):
    detail: GlueTableChangeDetail


class ScheduledRuleEvent(EventBridgeModel):
    pass


class DeferredRunEvent(EventBridgeModel):
    detail: BatchJobDeferred


@dataclass(frozen=True)
class Trigger:
    """A parsed event, reduced to what the launch decision needs."""

    kind: TriggerKind
    origin: str  # scheduler | rule | glue | s3 | manual
    event_id: str | None = None
    force: bool = False
    dry_run: bool = False
    table: str | None = None  # glue: database.table named by the event
    s3_bucket: str | None = None
    s3_key: str | None = None
    change: str | None = None
    consumer: str | None = None  # manual, deferred: only this consumer
    ended_job: str | None = None  # deferred: the job that deferred, ended by its own word


def _validate(event: dict[str, Any], model: type[BaseModel], what: str) -> Any:
    try:
        return parse(event=event, model=model)
    except ValidationError as e:
        raise InvalidEventError(f"malformed {what}: {validation_summary(e)}") from e


def parse_trigger(event: Any) -> Trigger:
    """Classify and validate an incoming event; InvalidEventError for anything unexpected."""
    if not isinstance(event, dict):
        raise InvalidEventError(
            f"expected a JSON object, got {summarize(event) if event is None else type(event).__name__}"
        )
    if not all(isinstance(k, str) for k in event):
        raise InvalidEventError("expected a JSON object: its keys must be strings")
    if "detail-type" in event:
        envelope = _validate(event, EventBridgeModel, "EventBridge event")
        source, detail_type = envelope.source, envelope.detail_type
        if detail_type == "Scheduled Event" and source in {"aws.events", "aws.scheduler"}:
            _validate(event, ScheduledRuleEvent, "scheduled event")
            return Trigger("schedule", "rule", event_id=summarize(envelope.id, 64))
        if source == "aws.glue" and detail_type == GLUE_DETAIL_TYPE:
            glue = _validate(event, GlueTableChangeEvent, "Glue table state change")
            d = glue.detail
            return Trigger(
                "append",
                "glue",
                event_id=summarize(glue.id, 64),
                table=summarize(f"{d.database_name}.{d.table_name}", 520),
                change=summarize(d.type_of_change, 64),
            )
        if source == "aws.s3" and detail_type == "Object Created":
            s3 = _validate(event, S3EventNotificationEventBridgeModel, "S3 Object Created event")
            return Trigger(
                "append",
                "s3",
                event_id=summarize(s3.id, 64),
                s3_bucket=summarize(s3.detail.bucket.name, 64),
                s3_key=summarize(s3.detail.object.key, 1100),
            )
        if source == EVENT_SOURCE and detail_type == BatchJobDeferred.detail_type:
            deferred = _validate(event, DeferredRunEvent, "Batch Job Deferred event").detail
            return Trigger(
                "append",
                "deferred",
                event_id=summarize(envelope.id, 64),
                consumer=deferred.consumer,
                ended_job=deferred.rayjob_name,
            )
        raise InvalidEventError(
            f"unsupported EventBridge event '{summarize(source)}' / '{summarize(detail_type)}': the launcher handles "
            "scheduled events, "
            f"{GLUE_DETAIL_TYPE!r}, S3 'Object Created' and {BatchJobDeferred.detail_type!r} (check the rule's event "
            "pattern)"
        )
    if "action" in event:
        manual = _validate(event, ManualInvoke, "manual invoke")
        kind: TriggerKind = manual.as_trigger
        return Trigger(kind, "manual", force=manual.force, dry_run=manual.dry_run, consumer=manual.consumer)
    if "trigger" in event:
        _validate(event, SchedulerInput, "scheduler input")
        return Trigger("schedule", "scheduler")
    keys = ", ".join(summarize(k, 40) for k in sorted(event)[:6]) + (", ..." if len(event) > 6 else "") or "nothing"
    raise InvalidEventError(
        f"unrecognised event (keys: {keys}); expected an EventBridge event, a scheduler input "
        '{"trigger": "schedule"} or a manual invoke {"action": "launch"}'
    )


def relevance(trigger: Trigger, source_table: str, table_location: str | None) -> str | None:
    """Why an append trigger does not concern a source table (None when it does)."""
    if trigger.origin == "glue":
        if (trigger.table or "").lower() != source_table.lower():
            return f"Glue change for {summarize(trigger.table)}, not {source_table}"
        if trigger.change not in GLUE_APPEND_CHANGES:
            return f"Glue change type {summarize(trigger.change)} adds no rows"
    if trigger.origin == "s3":
        if table_location is None:
            return "source table location unknown"
        prefix = table_location.rstrip("/") + "/metadata/"
        uri = f"s3://{trigger.s3_bucket}/{trigger.s3_key}"
        if not uri.startswith(prefix):
            return f"{summarize(uri)} is not under {prefix}"
        if not (trigger.s3_key or "").endswith(".metadata.json"):
            return f"{summarize(trigger.s3_key)} is not a table metadata file (manifests precede each commit)"
    return None
