"""moto in server mode: AWS APIs over real HTTP on 127.0.0.1, with IAM enforced where a test asks (``enforced_iam``)."""

from __future__ import annotations

import json
import os
import uuid
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


def _sign_reads_without_a_body() -> None:
    """Make moto's signature check of a read without a body (a REST GET, such as EKS's DescribeCluster or
    Scheduler's GetSchedule) hash the empty body it was signed with.

    moto 5.2 (moto/iam/access_control.py) recomputes the signature with ``data=self._body or self._data`` (for a
    query-protocol POST, whose form it has parsed): a GET is signed again over its parsed parameters, form-encoded,
    which no client signed, so with IAM enforced every such call fails with SignatureDoesNotMatch.
    """
    from moto.iam.access_control import IAMRequestBase

    if getattr(IAMRequestBase, "_icebatch_reads", False):
        return
    original = IAMRequestBase._create_aws_request

    def create_aws_request(self: Any) -> Any:
        request = original(self)
        if self._method in ("GET", "HEAD", "DELETE") and not self._body:
            request.data = b""
        return request

    IAMRequestBase._create_aws_request = create_aws_request  # type: ignore[method-assign]
    IAMRequestBase._icebatch_reads = True  # type: ignore[attr-defined]


@contextmanager
def moto_server(recorder: Any = None) -> Iterator[str]:
    """Start a ThreadedMotoServer on a free port and yield its endpoint URL.

    Three gaps of moto 5.2 against the real services are closed first (the code under test relies on each): see
    ``_report_eventbridge_configuration``, ``_deliver_whole_events`` and ``_sign_reads_without_a_body``.
    ``recorder``: a WSGI middleware factory wrapped around moto's app (tests/support/iam_audit.py records every call
    with it).
    """
    from moto.server import ThreadedMotoServer

    _report_eventbridge_configuration()
    _deliver_whole_events()
    _sign_reads_without_a_body()
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


def client(service: str, endpoint: str, credentials: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """A boto3 client of moto at ``endpoint``, as the test harness (``CREDS``) or with ``credentials`` (environment
    variable names: a role's, from ``assume``)."""
    import boto3

    creds = credentials or CREDS
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=creds.get("AWS_SESSION_TOKEN"),
    )


# --- moto's IAM enforcement ---------------------------------------------------------------------
# With it on, moto answers only requests signed by an IAM user's key or an assumed role's session, and only for the
# actions their identity policies allow: the action is moto's own reading of the request (``<service>:<operation>``;
# its S3 table for S3), not ours. What it does not enforce, from its source (moto/iam/access_control.py, 5.2):
# conditions (a statement with one never applies to an identity policy's call: denied), and resources for every
# service but S3 and SQS (the resource it checks is "*", which no ARN pattern matches). ``enforceable`` renders a
# role's statements into what moto can check; tests/support/iam_audit.py checks the rest (resources, conditions).
ANY = {"Resource": "*"}
_ENFORCING: set[str] = set()  # the endpoints of the servers with IAM enforced


def _reset_auth(endpoint: str, count: float) -> None:
    import urllib.request

    plain = {"Content-Type": "text/plain"}  # moto reads the count from the body as text
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", str(count).encode(), plain, method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        r.read()


def enforcing(endpoint: str) -> bool:
    return endpoint in _ENFORCING


@contextmanager
def lenient(endpoint: str) -> Iterator[None]:
    """IAM not enforced for the block, where it was (what moto cannot judge: ``assume``)."""
    if not enforcing(endpoint):
        yield
        return
    _reset_auth(endpoint, float("inf"))
    try:
        yield
    finally:
        _reset_auth(endpoint, 0)


@contextmanager
def enforced_iam(endpoint: str) -> Iterator[None]:
    """IAM enforced on the moto server at ``endpoint`` (moto's setting is its process's: every server of this
    process), for the harness too: ``CREDS`` and the environment's keys become an administrator's, an IAM user
    created for the purpose, until the block ends. Set up what needs moto's leniency first (``assume``)."""
    iam, harness = client("iam", endpoint), f"harness-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=harness)
    iam.put_user_policy(
        UserName=harness,
        PolicyName="everything",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", **ANY}]}),
    )
    key = iam.create_access_key(UserName=harness)["AccessKey"]
    before = dict(CREDS)
    harness = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    CREDS.update(harness)
    saved = {k: os.environ.get(k) for k in harness}
    os.environ.update(harness)
    _reset_auth(endpoint, 0)
    _ENFORCING.add(endpoint)
    try:
        yield
    finally:
        _ENFORCING.discard(endpoint)
        _reset_auth(endpoint, float("inf"))
        CREDS.update(before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assume(endpoint: str, role_arn: str, session: str) -> dict[str, str]:
    """A session of the role, as Lambda and EKS Pod Identity hand one to their code (environment variable names).
    Assumed leniently: moto cannot judge a trust policy whose principal is a service (its check fails on one)."""
    with lenient(endpoint):
        got = client("sts", endpoint).assume_role(RoleArn=role_arn, RoleSessionName=session)["Credentials"]
    return {
        "AWS_ACCESS_KEY_ID": got["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": got["SecretAccessKey"],
        "AWS_SESSION_TOKEN": got["SessionToken"],
    }


def enforceable(statements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A role's statements as moto can enforce them: no conditions, and "*" for the resources of every statement
    that grants an action outside S3 and SQS (the actions stay exactly the template's)."""
    out = []
    for statement in statements:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        rendered = {k: v for k, v in statement.items() if k != "Condition"}
        if any(a.split(":", 1)[0] not in ("s3", "sqs") for a in actions):
            rendered["Resource"] = "*"
        out.append(rendered)
    return out


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
