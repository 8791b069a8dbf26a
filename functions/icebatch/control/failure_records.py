"""Failed attempts on record: for ``icebatch runs`` and ``icebatch costs``, and for the launcher's daily budget.

Locally the bus's event log (``$ICEBATCH_HOME/events.jsonl``) keeps every "Batch Job Failed" event. On AWS
those events go to EventBridge and the reporter, whose SNS report is read once and gone: so the reporter also
writes each failure it reports, as the event's detail (JSON), beside the tables it concerns::

    <warehouse>/_icebatch/<deployment>/failures/<consumer>/<failed at, UTC>-<run id or event id>.json

One object per failed attempt: the same event delivered again (at least once) or reported by both the job
and the nightly reconciliation writes the same key. Keys sort by time within a consumer, so a reader after
a date starts there. Where the warehouse is not in S3 (the embedded default) there is no record: the event
log is it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from icebatch.core.aws_clients import aws_client, unreachable
from icebatch.core.errors import TransientError
from icebatch.core.events import BatchJobFailed
from icebatch.core.jsonl import records
from icebatch.core.settings import Settings
from icebatch.core.untrusted import summarize

log = logging.getLogger(__name__)
TIME_FORMAT = "%Y%m%dT%H%M%S%fZ"
THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "ServiceUnavailable"}


@dataclass(frozen=True)
class FailureRecords:
    """Where a deployment's failures are on record: a bucket and the key prefix its objects share."""

    bucket: str
    prefix: str  # ends with "/"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, detail: BatchJobFailed, event_id: str) -> str:
        when = detail.failed_at.astimezone(UTC).strftime(TIME_FORMAT)
        return f"{self.prefix}{detail.consumer}/{when}-{detail.run_id or event_id}.json"


def failure_records(settings: Settings) -> FailureRecords | None:
    """The deployment's failure records, under its ``s3://`` warehouse; None for any other warehouse."""
    warehouse = settings.catalog_props().get("warehouse") or ""
    if not warehouse.startswith("s3://"):
        return None
    bucket, _, path = warehouse.removeprefix("s3://").partition("/")
    path = path.strip("/")
    return FailureRecords(bucket, f"{path + '/' if path else ''}_icebatch/{settings.top.deployment}/failures/")


def record_failure(settings: Settings, detail: BatchJobFailed, event_id: str, *, client: Any = None) -> str | None:
    """Put the failure on record; its ``s3://`` URL, or None where there is no record (not an S3 warehouse).

    S3 out of reach or throttling is a TransientError (the reporter's invocation is retried, report and record
    together); any other refusal (access denied, no such bucket) is raised as it is, for the caller to report.
    """
    records = failure_records(settings)
    if records is None:
        return None
    key = records.key(detail, event_id)
    body = json.dumps(detail.model_dump(mode="json"), sort_keys=True).encode()
    try:
        (client or aws_client("s3", settings)).put_object(
            Bucket=records.bucket, Key=key, Body=body, ContentType="application/json"
        )
    except Exception as e:
        if _transient(e):
            raise TransientError(
                f"could not put the failure on record at {records.url}: {summarize(str(e), 300)}"
            ) from e
        raise
    return f"s3://{records.bucket}/{key}"


def failures_on_record(
    settings: Settings, consumers: Iterable[str], *, since: datetime | None = None
) -> Iterator[BatchJobFailed]:
    """Every failed attempt on record for these consumers: the local bus's log (all of it: it is at hand; no file
    where there is no local bus, as in a Lambda) and the records in S3 (since ``since``)."""
    wanted = set(consumers)
    yield from (f for f in logged_failures(settings.home / "events.jsonl") if f.consumer in wanted)
    yield from recorded_failures(settings, wanted, since=since)


def logged_failures(events: Path) -> Iterator[BatchJobFailed]:
    """The "Batch Job Failed" events of the local bus's log (``$ICEBATCH_HOME/events.jsonl``)."""

    def failure(event: Any) -> BatchJobFailed | None:
        if event.get("detail-type") != BatchJobFailed.detail_type:
            return None
        return BatchJobFailed.model_validate(event["detail"])

    return records(events, failure, "an event")


def recorded_failures(
    settings: Settings, consumers: Iterable[str], *, since: datetime | None = None, client: Any = None
) -> Iterator[BatchJobFailed]:
    """The failures on record for these consumers (since ``since``: by the time in their keys), oldest first.

    An object that is not a failure event is logged and passed over (the others still count); a record that
    cannot be listed or read at all is logged with what the reader's role needs, and nothing is returned.
    """
    records = failure_records(settings)
    if records is None:
        return
    s3 = client or aws_client("s3", settings)
    for consumer in consumers:
        folder = f"{records.prefix}{consumer}/"
        start = f"{folder}{since.astimezone(UTC).strftime(TIME_FORMAT)}" if since else ""
        try:
            for key in _keys(s3, records.bucket, folder, start):
                detail = _read(s3, records.bucket, key)
                if detail is not None and detail.consumer == consumer:
                    yield detail
        except Exception as e:
            log.warning(
                "the failed attempts of %s on record at %s were not read (%s): they are left out of the runs listed "
                "and of the day's spend; reading them needs s3:ListBucket on the bucket and s3:GetObject on the prefix",
                consumer,
                f"s3://{records.bucket}/{folder}",
                summarize(str(e), 300),
            )


def _keys(s3: Any, bucket: str, folder: str, start: str) -> Iterator[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder, StartAfter=start)
    for page in pages:
        for item in page.get("Contents", []):
            if str(item["Key"]).endswith(".json"):
                yield str(item["Key"])


def _read(s3: Any, bucket: str, key: str) -> BatchJobFailed | None:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    try:
        return BatchJobFailed.model_validate(json.loads(body))
    except ValueError as e:  # a JSON error or a validation error (pydantic's is a ValueError)
        log.warning("s3://%s/%s is not a failure record, passed over: %s", bucket, key, summarize(str(e), 200))
        return None


def _transient(error: BaseException) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(error, ClientError):
        return error.response.get("Error", {}).get("Code", "") in THROTTLED
    return isinstance(error, BotoCoreError) and unreachable(error)
