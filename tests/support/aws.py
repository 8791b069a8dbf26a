"""moto in server mode: AWS APIs over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

REGION = "us-east-1"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}


def _report_eventbridge_configuration() -> None:
    """Make moto's GetBucketNotificationConfiguration say when EventBridge is on, as S3 does.

    moto 5.2 stores ``EventBridgeConfiguration`` and sends the events, but leaves it out of the GET
    response; S3 answers ``<EventBridgeConfiguration/>`` (which the bucket-events custom resource reads).
    """
    from moto.core.responses import ActionResult
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_icebatch_eventbridge", False):
        return
    original = S3Response.get_bucket_notification

    def get_bucket_notification(self: Any) -> Any:
        config = self.backend.get_bucket_notification_configuration(self.bucket_name)
        if config is None or config.event_bridge is None:
            return original(self)
        serialize = self.serialized

        def with_eventbridge(result: Any) -> Any:
            fields = result.result if isinstance(result.result, dict) else {}
            return serialize(ActionResult({**fields, "EventBridgeConfiguration": {}}))

        self.serialized = with_eventbridge
        try:
            return original(self)
        finally:
            del self.serialized

    S3Response.get_bucket_notification = get_bucket_notification  # type: ignore[method-assign]
    S3Response._icebatch_eventbridge = True  # type: ignore[attr-defined]


def _deliver_whole_events() -> None:
    """Make moto's EventBridge keep ``account`` in the events it delivers, as EventBridge does.

    moto 5.2's default input template (used when a target has no input transformer) leaves it out.
    """
    from moto.events.utils import EventTemplateParser

    template = EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE
    if '"account"' not in template:
        EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE = template.replace(
            '"source": "<source>",', '"source": "<source>", "account": "<account>",'
        )


@contextmanager
def moto_server(recorder: Any = None) -> Iterator[str]:
    """Start a ThreadedMotoServer on a free port and yield its endpoint URL.

    Two gaps of moto 5.2 against the real services are closed first (the code under test relies on both):
    see ``_report_eventbridge_configuration`` and ``_deliver_whole_events``. ``recorder``: a WSGI middleware
    factory wrapped around moto's app (tests/support/iam_audit.py records every call with it).
    """
    from moto.server import ThreadedMotoServer

    _report_eventbridge_configuration()
    _deliver_whole_events()
    for k, v in CREDS.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    if recorder is not None:
        wsgi = server._server
        assert wsgi is not None
        wsgi.app = recorder(wsgi.app)  # type: ignore[attr-defined]
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def client(service: str, endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
    )


def glue_catalog_properties(endpoint: str, bucket: str) -> dict[str, str]:
    """pyiceberg Glue catalog + S3 FileIO against moto (credentials and region always given)."""
    return {
        "glue.endpoint": endpoint,
        "glue.region": REGION,
        "glue.access-key-id": CREDS["AWS_ACCESS_KEY_ID"],
        "glue.secret-access-key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "s3.endpoint": endpoint,
        "s3.region": REGION,
        "s3.access-key-id": CREDS["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "client.region": REGION,
        "client.access-key-id": CREDS["AWS_ACCESS_KEY_ID"],
        "client.secret-access-key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "warehouse": f"s3://{bucket}/warehouse",
    }
