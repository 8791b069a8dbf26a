"""The ``Custom::S3EventBridgeNotifications`` resource of template.yaml: the warehouse bucket's EventBridge.

CloudFormation waits for an answer on the request's presigned ``ResponseURL``; every request gets one,
failures included (a custom resource that never answers holds the stack for an hour).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from icebatch.control.handlers import environment_settings
from icebatch.core.aws_clients import aws_client
from icebatch.core.settings import Settings

logger = Logger(service="bucket-events")
RESPONSE_TIMEOUT = 30


@logger.inject_lambda_context(log_event=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext, settings: Settings | None = None) -> dict[str, Any]:
    try:
        physical_id, data = handle(event, _s3(settings or environment_settings()))
        status, reason = "SUCCESS", "ok"
    except Exception as e:  # any failure is reported to CloudFormation, which rolls back
        logger.exception("custom resource failed")
        physical_id = str(event.get("PhysicalResourceId") or event.get("LogicalResourceId") or "failed")
        status, reason, data = "FAILED", f"{type(e).__name__}: {e}"[:500], {}
    respond(event, status, reason, physical_id, data)
    return {"Status": status, "PhysicalResourceId": physical_id, "Data": data}


def _s3(settings: Settings) -> Any:
    return aws_client("s3", settings)


def handle(event: dict[str, Any], s3: Any) -> tuple[str, dict[str, str]]:
    """Create/Update: EventBridge on; Delete: off again if this resource turned it on."""
    from aws_lambda_powertools.utilities.parser import parse
    from aws_lambda_powertools.utilities.parser.models import (
        CloudFormationCustomResourceCreateModel,
        CloudFormationCustomResourceDeleteModel,
        CloudFormationCustomResourceUpdateModel,
    )

    from icebatch.control.bucket_events import BucketEventBridge, disable, enable

    kind = event.get("RequestType")
    if kind == "Delete":
        deleted = parse(event=event, model=CloudFormationCustomResourceDeleteModel)
        state = BucketEventBridge.from_physical_id(deleted.physical_resource_id)
        changed = disable(s3, state) if state is not None else False
        return deleted.physical_resource_id, {"Disabled": str(changed).lower()}
    previous: str | None = None
    if kind == "Update":
        updated = parse(event=event, model=CloudFormationCustomResourceUpdateModel)
        properties, previous = updated.resource_properties, updated.physical_resource_id
    else:
        properties = parse(event=event, model=CloudFormationCustomResourceCreateModel).resource_properties
    bucket = str(dict(properties or {}).get("Bucket") or "")
    if not bucket:
        raise ValueError("the resource needs a Bucket property")
    state = enable(s3, bucket)
    if previous is not None and previous.startswith(f"{bucket}/eventbridge/"):
        return previous, {"Bucket": bucket}  # the same bucket: keep what the create recorded
    return state.physical_id, {"Bucket": bucket}


def respond(event: dict[str, Any], status: str, reason: str, physical_id: str, data: dict[str, str]) -> None:
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason,
            "PhysicalResourceId": physical_id,
            "StackId": event.get("StackId"),
            "RequestId": event.get("RequestId"),
            "LogicalResourceId": event.get("LogicalResourceId"),
            "Data": data,
        }
    ).encode()
    request = urllib.request.Request(str(event["ResponseURL"]), data=body, method="PUT", headers={"Content-Type": ""})
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT):
        pass
