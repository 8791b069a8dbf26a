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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icebatch.errors import TransientError
from icebatch.events import BatchJobCompleted, BatchJobFailed
from icebatch.report import completed_text, failed_text, subject

if TYPE_CHECKING:
    from icebatch.settings import Settings

log = logging.getLogger(__name__)


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


class FileNotifier(Notifier):
    """The embedded default: print the report and keep it under ``reports/``."""

    def __init__(self, folder: Path, out: Callable[[str], None] = print) -> None:
        self.folder = folder
        self.out = out

    def notify(self, report: CostReport) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = f"{report.key}.{report.status}"
        (self.folder / f"{stem}.txt").write_text(f"Subject: {report.subject}\n\n{report.text}\n")
        (self.folder / f"{stem}.json").write_text(
            json.dumps({"subject": report.subject, "attributes": report.attributes, **report.data}, indent=2)
        )
        self.out(f"\n[report] {report.subject}\n{report.text}\n[report written to {self.folder / stem}.txt]")
        return stem


def load_notifier(settings: Settings, *, client: Any = None) -> Notifier:
    if settings.sns_topic_arn:
        if client is None:
            import boto3

            client = boto3.client("sns", region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url)
        return SnsNotifier(client, settings.sns_topic_arn)
    return FileNotifier(settings.reports_dir)
