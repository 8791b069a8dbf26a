"""The warehouse bucket's EventBridge switch (template.yaml's custom resource), against moto over HTTP.

CloudFormation's side is a local HTTP server that receives the custom resource's answer, as the
presigned ResponseURL would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from icebatch.core.settings import Settings
from icebatch.tools.invoke import LocalContext

from tests.support.aws import REGION, client
from tests.support.http_server import cloudformation_responses

pytestmark = pytest.mark.functional


@pytest.fixture
def cloudformation() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with cloudformation_responses("/response") as served:
        yield served


@pytest.fixture
def s3(aws_endpoint: str, aws_settings: Settings) -> Any:
    CALL_SETTINGS.append(aws_settings)
    return client("s3", aws_endpoint)


@pytest.fixture
def aws_settings(aws_endpoint: str, tmp_path: Any) -> Settings:
    return Settings(home=tmp_path, aws_endpoint_url=aws_endpoint, aws_region=REGION)


def request(kind: str, url: str, bucket: str | None, physical_id: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "RequestType": kind,
        "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:warehouse-events",
        "ResponseURL": url,
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/icebatch-dev/1",
        "RequestId": str(uuid.uuid4()),
        "LogicalResourceId": "WarehouseEventBridge",
        "ResourceType": "Custom::S3EventBridgeNotifications",
        "ResourceProperties": {"ServiceToken": "x", **({"Bucket": bucket} if bucket else {})},
    }
    if physical_id:
        event["PhysicalResourceId"] = physical_id
    return event


CALL_SETTINGS: list[Settings] = []


def call(event: dict[str, Any]) -> dict[str, Any]:
    from icebatch.control.handlers.bucket_events import lambda_handler

    return lambda_handler(event, LocalContext("warehouse-events"), settings=CALL_SETTINGS[-1])  # type: ignore[arg-type]


def test_create_turns_eventbridge_on_keeps_other_notifications_and_delete_undoes_it(
    s3: Any, aws_endpoint: str, cloudformation: tuple[str, list[dict[str, Any]]]
) -> None:
    # given a warehouse bucket that already notifies a queue
    url, answers = cloudformation
    bucket = f"wh-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    sqs = client("sqs", aws_endpoint)
    queue = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectRemoved:*"]}]},
    )
    # when CloudFormation creates the resource
    created = call(request("Create", url, bucket))
    # then EventBridge is on, the queue notification is still there, and CloudFormation heard SUCCESS
    config = s3.get_bucket_notification_configuration(Bucket=bucket)
    assert "EventBridgeConfiguration" in config and config["QueueConfigurations"][0]["QueueArn"] == arn
    assert answers[-1]["Status"] == "SUCCESS" and answers[-1]["PhysicalResourceId"] == f"{bucket}/eventbridge/enabled"
    # when the stack is deleted, then EventBridge is off again and the queue notification stays
    call(request("Delete", url, bucket, created["PhysicalResourceId"]))
    config = s3.get_bucket_notification_configuration(Bucket=bucket)
    assert "EventBridgeConfiguration" not in config and config["QueueConfigurations"][0]["QueueArn"] == arn
    assert answers[-1]["Status"] == "SUCCESS"


def test_a_bucket_that_already_had_eventbridge_keeps_it_after_the_stack_is_gone(
    s3: Any, cloudformation: tuple[str, list[dict[str, Any]]]
) -> None:
    url, _ = cloudformation
    bucket = f"wh-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
    created = call(request("Create", url, bucket))
    assert created["PhysicalResourceId"] == f"{bucket}/eventbridge/kept"
    call(request("Delete", url, bucket, created["PhysicalResourceId"]))
    assert "EventBridgeConfiguration" in s3.get_bucket_notification_configuration(Bucket=bucket)


def test_failures_are_answered_so_the_stack_does_not_hang(
    s3: Any, cloudformation: tuple[str, list[dict[str, Any]]]
) -> None:
    url, answers = cloudformation
    call(request("Create", url, None))
    assert answers[-1]["Status"] == "FAILED" and "Bucket" in answers[-1]["Reason"]
    call(request("Create", url, f"no-such-bucket-{uuid.uuid4().hex[:6]}"))
    assert answers[-1]["Status"] == "FAILED" and "NoSuchBucket" in answers[-1]["Reason"]
    # a delete of a resource whose create failed succeeds without touching anything
    call(request("Delete", url, None, "WarehouseEventBridge"))
    assert answers[-1]["Status"] == "SUCCESS"


def test_once_on_a_commits_metadata_file_reaches_the_launcher_rule_and_its_manifests_do_not(
    s3: Any, aws_endpoint: str, cloudformation: tuple[str, list[dict[str, Any]]]
) -> None:
    from icebatch.core.rules import PATTERNS, fill

    # given the bucket with EventBridge turned on by the custom resource, and the launcher's S3 rule
    url, _ = cloudformation
    bucket = f"wh-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    call(request("Create", url, bucket))
    events, sqs = client("events", aws_endpoint), client("sqs", aws_endpoint)
    queue = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    prefix = "warehouse/support.db/tickets/"
    pattern = fill(PATTERNS["launcher-s3-metadata-object"], {"WarehouseBucket": bucket, "SourceTablePrefix": prefix})
    rule = f"launcher-s3-{uuid.uuid4().hex[:6]}"
    events.put_rule(Name=rule, EventPattern=json.dumps(pattern))
    events.put_targets(Rule=rule, Targets=[{"Id": "q", "Arn": arn}])
    try:
        # when a commit writes its manifests, then its metadata file, and a data file lands too
        for key in (
            "metadata/snap-1-0-a.avro",
            "metadata/a-m0.avro",
            "data/00000-0-a.parquet",
            "metadata/00001-a.metadata.json",
        ):
            s3.put_object(Bucket=bucket, Key=prefix + key, Body=b"x")
        # then exactly one event reaches the launcher: the metadata file's
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        keys = [json.loads(m["Body"])["detail"]["object"]["key"] for m in got]
        assert keys == [prefix + "metadata/00001-a.metadata.json"]
    finally:
        events.remove_targets(Rule=rule, Ids=["q"])
        events.delete_rule(Name=rule)
