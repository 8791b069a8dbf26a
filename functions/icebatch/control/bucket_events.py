"""Turning on (and off) the EventBridge notifications of an existing S3 bucket.

The warehouse bucket is not the stack's own (CloudFormation can only configure buckets it creates), so a
custom resource does it: ``put_bucket_notification_configuration`` replaces the whole configuration,
hence the existing queue, topic and function notifications are read first and written back unchanged.

The physical resource id records whether EventBridge was already on before this stack: deleting the
stack turns it off only if the stack turned it on (another stack or tool may rely on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEPT = ("TopicConfigurations", "QueueConfigurations", "LambdaFunctionConfigurations")


@dataclass(frozen=True)
class BucketEventBridge:
    bucket: str
    enabled_by_us: bool

    @property
    def physical_id(self) -> str:
        return f"{self.bucket}/eventbridge/{'enabled' if self.enabled_by_us else 'kept'}"

    @classmethod
    def from_physical_id(cls, physical_id: str) -> BucketEventBridge | None:
        bucket, _, how = physical_id.rpartition("/eventbridge/")
        if not bucket or how not in {"enabled", "kept"}:
            return None  # e.g. the id CloudFormation gives a resource whose create failed
        return cls(bucket, enabled_by_us=how == "enabled")


def _current(s3: Any, bucket: str) -> dict[str, Any]:
    return dict(s3.get_bucket_notification_configuration(Bucket=bucket))


def enable(s3: Any, bucket: str) -> BucketEventBridge:
    """EventBridge on, other notifications kept; says whether it was off before."""
    current = _current(s3, bucket)
    if "EventBridgeConfiguration" in current:
        return BucketEventBridge(bucket, enabled_by_us=False)
    config = {k: current[k] for k in KEPT if current.get(k)}
    config["EventBridgeConfiguration"] = {}
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration=config, SkipDestinationValidation=True
    )
    return BucketEventBridge(bucket, enabled_by_us=True)


def disable(s3: Any, state: BucketEventBridge) -> bool:
    """EventBridge off again if we turned it on; returns whether anything changed."""
    if not state.enabled_by_us:
        return False
    current = _current(s3, state.bucket)
    if "EventBridgeConfiguration" not in current:
        return False
    config = {k: current[k] for k in KEPT if current.get(k)}
    s3.put_bucket_notification_configuration(
        Bucket=state.bucket, NotificationConfiguration=config, SkipDestinationValidation=True
    )
    return True
