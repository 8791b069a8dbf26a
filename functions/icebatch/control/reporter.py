"""Cost reports: what a run did and cost, for people (text) and machines (JSON), sent to SNS.

One SNS message per run with ``MessageStructure=json``: email subscribers get the text report
(``INCREMENTAL STATE`` / ``BATCH SUMMARY`` / ``TOKENOMICS``), SQS/Lambda/HTTP subscribers get the JSON
form. Message attributes (``consumer``, ``status``, ``cost_usd``, ``rows``) let subscribers filter.
In the embedded default the report is printed and written under ``$ICEBATCH_HOME/reports/``.
"""

from __future__ import annotations

import json
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from icebatch.core.aws_clients import aws_client, unreachable
from icebatch.core.bus import load_adapter
from icebatch.core.costs.prices import BatchPrice
from icebatch.core.costs.report import completed_text, failed_text, subject
from icebatch.core.errors import InvalidEventError, PermanentError, RefusedError, TransientError
from icebatch.core.events import EVENT_SOURCE, BatchJobCompleted, BatchJobFailed
from icebatch.core.untrusted import summarize, validation_summary

if TYPE_CHECKING:
    from icebatch.core.costs.last_runs import PastRun
    from icebatch.core.settings import Settings

log = logging.getLogger(__name__)
EVENT_ID = r"[A-Za-z0-9-]{1,128}"  # EventBridge ids are UUIDs; a failure without a run id files its report by it
FILE_NOTIFIER = "icebatch.tools.local_reports:file_notifier"


@dataclass(frozen=True)
class CostReport:
    key: str  # run id (or event id)
    status: str  # completed | failed
    subject: str
    text: str
    data: dict[str, Any]
    attributes: dict[str, str | float]


def build_report(
    detail: BatchJobCompleted | BatchJobFailed,
    *,
    event_id: str,
    prices: tuple[BatchPrice, ...] = (),
    last_runs: list[PastRun] | None = None,
) -> CostReport:
    """The report of an event; ``prices``: batch APIs its tokens are priced at beside the GPU's cost; ``last_runs``:
    the consumer's runs before this one, to set it beside them (None: not read)."""
    report = _report(detail, event_id=event_id, prices=prices)
    if last_runs is None:
        return report
    from icebatch.core.costs.last_runs import last_runs_text

    per_1k = detail.cost.usd_per_1k_rows if isinstance(detail, BatchJobCompleted) else None
    noun = detail.row_noun if isinstance(detail, BatchJobCompleted) else "rows"
    block = last_runs_text(last_runs, this_usd_per_1k_rows=per_1k, noun=noun)
    data = {**report.data, "last_runs": [r.to_dict() for r in last_runs]}
    return replace(report, text=f"{report.text}\n{block}", data=data)


def _report(detail: BatchJobCompleted | BatchJobFailed, *, event_id: str, prices: tuple[BatchPrice, ...]) -> CostReport:
    data = {"detail_type": detail.detail_type, "event_id": event_id, **detail.model_dump(mode="json")}
    if isinstance(detail, BatchJobCompleted):
        cost = detail.cost.lifetime_cost
        data["batch_api_usd"] = {p.name: round(p.cost(detail.tokens.input, detail.tokens.output), 6) for p in prices}
        return CostReport(
            key=detail.run_id,
            status="completed",
            subject=subject(detail),
            text=completed_text(detail, prices=prices),
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


SNS_SUBJECT_MAX = 100  # characters, printable ASCII, no line breaks (SNS rejects anything else)
SNS_MESSAGE_MAX = 256 * 1024  # bytes, the whole JSON message (every protocol's copy) and its attributes
SNS_BUDGET = 240 * 1024  # what the message may take, leaving room for the attributes
PERMANENT_SNS_ERRORS = {"InvalidParameter", "InvalidParameterValue"}  # the message itself: sending it again cannot help
# the deployment refuses the publish (the role's grant, the topic, its key): the event is kept for a re-drive once fixed
REFUSED_SNS_ERRORS = {
    "AuthorizationError",
    "NotFound",
    "KMSAccessDenied",
    "KMSDisabled",
    "KMSInvalidState",
    "KMSNotFound",
    "KMSOptInRequired",
}


def sns_subject(text: str) -> str:
    """``text`` as SNS accepts a subject: printable ASCII, one line, at most 100 characters."""
    clean = "".join(ch if " " <= ch <= "~" else "?" for ch in text).strip()
    return (clean or "icebatch report")[:SNS_SUBJECT_MAX]


def sns_message(report: CostReport) -> tuple[str, bool]:
    """The ``MessageStructure=json`` message within SNS's size limit, and whether it had to be cut.

    Only a failure's ``reason`` is unbounded (an exception's text); when the message would not fit, it is
    cut in both forms and the report says so. The full report is in the reporter's log (and, locally, in
    the report file).
    """
    text, data, limit = report.text, report.data, 64 * 1024
    while True:
        machine = json.dumps(data, sort_keys=True)
        message = json.dumps(
            {"default": text, "email": text, "sqs": machine, "lambda": machine, "https": machine, "http": machine}
        )
        if len(message.encode()) <= SNS_BUDGET:
            return message, text is not report.text
        if limit < 256:  # nothing left to cut: the rest of the report is bounded by the contracts
            raise PermanentError(f"the report of {report.key} does not fit in an SNS message even when cut")
        reason = str(report.data.get("reason", ""))
        note = f" [cut to fit SNS: {len(reason):,} characters in the reporter's log]"
        data = {**report.data, "reason": reason[:limit] + note, "reason_cut": True}
        text = _cut_lines(report.text, limit) + "\n[report cut to fit SNS; the full report is in the reporter's log]"
        limit //= 2


def _cut_lines(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class SnsNotifier(Notifier):
    def __init__(self, client: Any, topic_arn: str) -> None:
        self.client = client
        self.topic_arn = topic_arn

    def notify(self, report: CostReport) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        message, cut = sns_message(report)
        if cut:
            log.warning("report of %s cut to fit SNS; full report follows\n%s", report.key, report.text)
        attributes = {
            k: {"DataType": "Number", "StringValue": repr(v)}
            if isinstance(v, (int, float))
            else {"DataType": "String", "StringValue": str(v)}
            for k, v in report.attributes.items()
        }
        try:
            response = self.client.publish(
                TopicArn=self.topic_arn,
                Subject=sns_subject(report.subject),
                Message=message,
                MessageStructure="json",
                MessageAttributes=attributes,
            )
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in PERMANENT_SNS_ERRORS:  # retrying cannot help: dead-lettering it would only hide it
                raise PermanentError(
                    f"SNS refused the report of {report.key} ({code}): {summarize(str(e), 300)}"
                ) from e
            if code in REFUSED_SNS_ERRORS:
                raise RefusedError(
                    f"SNS refused to publish the report of {report.key} to {self.topic_arn} ({code}): check the "
                    "topic, its key and the reporter's role; the event is kept in the reporter's dead-letter queue "
                    f"after Lambda's retries, to re-drive once fixed: {summarize(str(e), 300)}"
                ) from e
            raise TransientError(f"could not publish the report to {self.topic_arn}: {summarize(str(e), 300)}") from e
        except BotoCoreError as e:
            if not unreachable(e):
                raise
            raise TransientError(f"could not publish the report to {self.topic_arn}: {summarize(str(e), 300)}") from e
        return str(response["MessageId"])


def load_notifier(settings: Settings, *, client: Any = None) -> Notifier:
    """SNS when a topic is configured; else the local reports folder (tooling)."""
    if settings.aws.sns_topic_arn:
        if client is None:
            client = aws_client("sns", settings)
        return SnsNotifier(client, settings.aws.sns_topic_arn)
    notifier: Notifier = load_adapter(FILE_NOTIFIER, "the local reports folder (no ICEBATCH_SNS_TOPIC_ARN)")(settings)
    return notifier


def parse_detail(event: Any) -> BatchJobCompleted | BatchJobFailed:
    """The Completed/Failed detail of an EventBridge event, validated; InvalidEventError otherwise."""
    from aws_lambda_powertools.utilities.parser import ValidationError, parse
    from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

    if not isinstance(event, dict):
        raise InvalidEventError(f"expected an EventBridge event (a JSON object), got {type(event).__name__}")
    if not all(isinstance(k, str) for k in event):
        raise InvalidEventError("expected an EventBridge event: its keys must be strings")
    try:
        envelope = parse(event=event, model=EventBridgeModel)
    except ValidationError as e:
        raise InvalidEventError(f"not an EventBridge event: {validation_summary(e)}") from e
    if not re.fullmatch(EVENT_ID, envelope.id):
        raise InvalidEventError(f"event id '{summarize(envelope.id, 40)}' is not an EventBridge id (a UUID)")
    models: dict[str, type[BatchJobCompleted | BatchJobFailed]] = {
        m.detail_type: m for m in (BatchJobCompleted, BatchJobFailed)
    }
    if envelope.source != EVENT_SOURCE or envelope.detail_type not in models:
        raise InvalidEventError(
            f"the reporter handles {sorted(models)} from source {EVENT_SOURCE!r}, got "
            f"'{summarize(envelope.detail_type)}' from '{summarize(envelope.source)}' (check the rule's event pattern)"
        )
    try:
        return models[envelope.detail_type].model_validate(envelope.detail)
    except ValidationError as e:
        raise InvalidEventError(f"malformed {envelope.detail_type!r} detail: {validation_summary(e)}") from e


def report_with(settings: Settings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Parse an event, build its report and deliver it with the settings' notifier."""
    notifier = load_notifier(settings)

    def report(event: dict[str, Any]) -> dict[str, Any]:
        detail = parse_detail(event)
        built = build_report(
            detail,
            event_id=event["id"],
            prices=settings.cost.batch_prices(),
            last_runs=read_last_runs(settings, detail),
        )
        recorded = put_on_record(settings, detail, event["id"]) if isinstance(detail, BatchJobFailed) else None
        return {
            "status": "reported",
            "run": built.key,
            "subject": built.subject,
            "message_id": notifier.notify(built),
            "report_status": built.status,
            "attributes": built.attributes,
            **({"failure_record": recorded} if recorded else {}),
        }

    return report


def read_last_runs(settings: Settings, detail: BatchJobCompleted | BatchJobFailed) -> list[PastRun] | None:
    """The consumer's runs before this one, from its ledger (the results table's metadata); None when the
    settings leave them out or they cannot be read (the report goes without them, and the log says why)."""
    limit = settings.cost.report_last_runs
    if limit == 0:
        return None
    try:
        from icebatch.core.consumers import consumer_named, load_consumers
        from icebatch.core.costs.last_runs import past_runs
        from icebatch.core.ledger import open_ledger

        consumer = consumer_named(load_consumers(settings), detail.consumer)
        records = open_ledger(settings, consumer, control_plane=True).runs()
    except Exception as e:  # a report without its history beats no report: never fatal, never retried for it
        log.warning("the last runs of %s were not read for its report: %s", detail.consumer, summarize(repr(e), 300))
        return None
    return past_runs(records, settings, this_run=detail.run_id or "", limit=limit)


def put_on_record(settings: Settings, detail: BatchJobFailed, event_id: str) -> str | None:
    """The failure on record for ``icebatch runs`` (``icebatch.control.failure_records``), before its report goes
    out: its URL, None where the warehouse is not in S3, or why it was not written. A transient error is raised
    (report and record are retried together); a refusal is logged and the report still goes out."""
    from icebatch.control.failure_records import record_failure

    try:
        return record_failure(settings, detail, event_id)
    except TransientError:
        raise
    except Exception as e:
        reason = summarize(str(e), 300)
        log.error(
            "the failure of %s was not put on record (%s): the report goes out, but `icebatch runs` will not "
            "list this attempt; the reporter's role needs s3:PutObject on the records' prefix",
            detail.run_id or event_id,
            reason,
        )
        return f"not recorded: {reason}"
