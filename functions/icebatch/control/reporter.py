"""Cost reports: what a run did and cost, for people (text) and machines (JSON), sent to SNS.

One SNS message per run with ``MessageStructure=json``: email subscribers get the text report
(``INCREMENTAL STATE`` / ``BATCH SUMMARY`` / ``TOKENOMICS``), SQS/Lambda/HTTP subscribers get the JSON
form. Message attributes (``consumer``, ``status``, ``cost_usd``, ``rows``) let subscribers filter.
In the embedded default the report is printed and written under ``$ICEBATCH_HOME/reports/``.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icebatch.core.bus import load_adapter
from icebatch.core.errors import InvalidEventError, TransientError
from icebatch.core.events import EVENT_SOURCE, BatchJobCompleted, BatchJobFailed
from icebatch.core.report import completed_text, failed_text, subject

if TYPE_CHECKING:
    from icebatch.core.settings import Settings

log = logging.getLogger(__name__)
FILE_NOTIFIER = "icebatch.tools.local_reports:file_notifier"


@dataclass(frozen=True)
class CostReport:
    key: str  # run id (or event id)
    status: str  # completed | failed
    subject: str
    text: str
    data: dict[str, Any]
    attributes: dict[str, str | float]


def build_report(detail: BatchJobCompleted | BatchJobFailed, *, event_id: str) -> CostReport:
    data = {"detail_type": detail.detail_type, "event_id": event_id, **detail.model_dump(mode="json")}
    if isinstance(detail, BatchJobCompleted):
        cost = detail.cost.lifetime_cost
        return CostReport(
            key=detail.run_id,
            status="completed",
            subject=subject(detail),
            text=completed_text(detail),
            data=data,
            attributes={
                "deployment": detail.deployment,
                "consumer": detail.consumer,
                "status": "completed",
                "cost_usd": round(cost, 6),
                "rows": detail.rows,
            },
        )
    cost_so_far = detail.cost.lifetime_cost if detail.cost else 0.0
    return CostReport(
        key=detail.run_id or event_id,
        status="failed",
        subject=subject(detail),
        text=failed_text(detail),
        data=data,
        attributes={
            "deployment": detail.deployment,
            "consumer": detail.consumer,
            "status": "failed",
            "cost_usd": round(cost_so_far, 6),
            "rows": detail.rows_processed,
        },
    )


class Notifier(ABC):
    @abstractmethod
    def notify(self, report: CostReport) -> str:
        """Deliver the report; returns a message id."""


class SnsNotifier(Notifier):
    def __init__(self, client: Any, topic_arn: str) -> None:
        self.client = client
        self.topic_arn = topic_arn

    def notify(self, report: CostReport) -> str:
        from botocore.exceptions import ClientError, EndpointConnectionError

        machine = json.dumps(report.data, sort_keys=True)
        message = {"default": report.text, "email": report.text, "sqs": machine, "lambda": machine,
                   "https": machine, "http": machine}  # fmt: skip
        attributes = {
            k: {"DataType": "Number", "StringValue": repr(v)} if isinstance(v, (int, float))
            else {"DataType": "String", "StringValue": str(v)}
            for k, v in report.attributes.items()
        }  # fmt: skip
        try:
            response = self.client.publish(
                TopicArn=self.topic_arn,
                Subject=report.subject,
                Message=json.dumps(message),
                MessageStructure="json",
                MessageAttributes=attributes,
            )
        except (ClientError, EndpointConnectionError) as e:
            raise TransientError(f"could not publish the report to {self.topic_arn}: {e}") from e
        return str(response["MessageId"])


def load_notifier(settings: Settings, *, client: Any = None) -> Notifier:
    """SNS when a topic is configured; else the local reports folder (tooling)."""
    if settings.aws.sns_topic_arn:
        if client is None:
            import boto3

            client = boto3.client(
                "sns", region_name=settings.aws.aws_region, endpoint_url=settings.aws.aws_endpoint_url
            )
        return SnsNotifier(client, settings.aws.sns_topic_arn)
    notifier: Notifier = load_adapter(FILE_NOTIFIER, "the local reports folder (no ICEBATCH_SNS_TOPIC_ARN)")(settings)
    return notifier


def parse_detail(event: Any) -> BatchJobCompleted | BatchJobFailed:
    """The Completed/Failed detail of an EventBridge event, validated; InvalidEventError otherwise."""
    from aws_lambda_powertools.utilities.parser import ValidationError, parse
    from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

    if not isinstance(event, dict):
        raise InvalidEventError(f"expected an EventBridge event (a JSON object), got {type(event).__name__}")
    try:
        envelope = parse(event=event, model=EventBridgeModel)
    except ValidationError as e:
        raise InvalidEventError(f"not an EventBridge event: {_first(e)}") from e
    models: dict[str, type[BatchJobCompleted | BatchJobFailed]] = {
        m.detail_type: m for m in (BatchJobCompleted, BatchJobFailed)
    }
    if envelope.source != EVENT_SOURCE or envelope.detail_type not in models:
        raise InvalidEventError(
            f"the reporter handles {sorted(models)} from source {EVENT_SOURCE!r}, got {envelope.detail_type!r} "
            f"from {envelope.source!r} (check the rule's event pattern)"
        )
    try:
        return models[envelope.detail_type].model_validate(envelope.detail)
    except ValidationError as e:
        raise InvalidEventError(f"malformed {envelope.detail_type!r} detail: {_first(e)}") from e


def _first(e: Any) -> str:
    errors = e.errors() if hasattr(e, "errors") else []
    if not errors:
        return str(e)
    where = ".".join(str(p) for p in errors[0].get("loc", ())) or "event"
    return f"{where}: {errors[0].get('msg')}"


def report_with(settings: Settings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Parse an event, build its report and deliver it with the settings' notifier."""
    notifier = load_notifier(settings)

    def report(event: dict[str, Any]) -> dict[str, Any]:
        built = build_report(parse_detail(event), event_id=event["id"])
        return {
            "status": "reported",
            "run": built.key,
            "subject": built.subject,
            "message_id": notifier.notify(built),
            "report_status": built.status,
            "attributes": built.attributes,
        }

    return report
