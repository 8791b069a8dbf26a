"""Which AWS calls each principal made, and whether its IAM policy allows every one of them.

moto (with authentication off) accepts any call. To prove the template's least-privilege policies are
also *sufficient*, every request reaching the moto server is recorded — who (the access key of the
signature), which action, on which resource, with which condition keys — and evaluated against the
policy of the role that key stands for: IAM's Allow semantics, with ``*``/``?`` wildcards in actions and
resources and the condition operators the template uses (StringEquals, StringLike, ArnEquals, ArnLike).

Only what icebatch's roles call is understood: S3 (REST), Glue, DynamoDB, EventBridge, SNS, SQS (JSON
and query protocols), EKS DescribeCluster. Anything else is recorded as "unknown" and fails an audit.
"""

from __future__ import annotations

import fnmatch
import io
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

REGION_ACCOUNT = ("us-east-1", "123456789012")
KEPT_BODY_BYTES = 1 << 20  # a request with a bigger body is recorded without it (it cannot be sent again)
_CREDENTIAL = re.compile(r"Credential=([^/]+)/[^/]+/([^/]+)/([^/]+)/aws4_request")


@dataclass(frozen=True)
class Request:
    """A request as it reached the server, enough to send it again (``replay``)."""

    method: str
    uri: str  # path and query, as sent
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True)
class Call:
    key: str  # access key id that signed it
    service: str
    action: str  # IAM action, e.g. s3:GetObject
    resources: tuple[str, ...]  # every ARN IAM checks for it
    context: tuple[tuple[str, str], ...] = ()  # condition keys
    request: Request | None = field(default=None, compare=False, repr=False)  # None: its body was too big to keep

    def __str__(self) -> str:
        extra = f" {dict(self.context)}" if self.context else ""
        return f"{self.action} on {', '.join(self.resources)}{extra}"


@dataclass
class Recorder:
    """WSGI middleware in front of moto's app that records every call."""

    app: Callable[..., Any]
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        body = b""
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if 0 < length <= KEPT_BODY_BYTES:
            # the JSON/query APIs name their resource in the body; S3 names it in the path, and its bodies (data,
            # sometimes large: the model's files) are kept to be sent again only when small
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
        whole = length <= KEPT_BODY_BYTES and not environ.get("HTTP_TRANSFER_ENCODING")
        request = _request(environ, body) if whole else None
        try:
            for call in describe(environ, body):
                with self.lock:
                    self.calls.append(replace(call, request=request))
        except Exception as e:  # never break moto over a recording problem
            with self.lock:
                self.calls.append(Call("?", "?", f"unparsed:{type(e).__name__}", ()))
        return self.app(environ, start_response)

    def by(self, key: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.key == key]


def _request(environ: dict[str, Any], body: bytes) -> Request:
    headers = [(k[5:].replace("_", "-").lower(), v) for k, v in environ.items() if k.startswith("HTTP_")]
    headers += [(k.replace("_", "-").lower(), environ[k]) for k in ("CONTENT_TYPE", "CONTENT_LENGTH") if environ.get(k)]
    return Request(environ["REQUEST_METHOD"], environ["RAW_URI"], tuple(headers), body)


def replay(endpoint: str, call: Call) -> tuple[int, str]:
    """Send the call's request again, exactly as it was signed: the status and body of moto's answer."""
    import http.client

    assert call.request is not None, f"{call}: its request was not kept"
    url = urllib.parse.urlsplit(endpoint)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        r = call.request
        connection.putrequest(r.method, r.uri, skip_host=True, skip_accept_encoding=True)
        for name, value in r.headers:
            connection.putheader(name, value)
        connection.endheaders(r.body or None)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


def sendable(calls: Iterable[Call]) -> tuple[Call, bool]:
    """A call whose request was kept, other than a HEAD where there is one; and whether it is a HEAD."""
    kept = [c for c in calls if c.request is not None]
    assert kept, "no request of these calls was kept"
    call = next((c for c in kept if c.request is not None and c.request.method != "HEAD"), kept[0])
    return call, call.request is not None and call.request.method == "HEAD"


def describe(environ: dict[str, Any], body: bytes) -> list[Call]:
    auth = environ.get("HTTP_AUTHORIZATION", "")
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    m = _CREDENTIAL.search(auth) or _CREDENTIAL.search("Credential=" + (query.get("X-Amz-Credential", [""])[0]))
    if m is None:
        return []
    key, region, service = m.group(1), m.group(2), m.group(3)
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    method, path = environ["REQUEST_METHOD"], urllib.parse.unquote(environ.get("PATH_INFO", ""))
    account = REGION_ACCOUNT[1]
    arn = f"arn:aws:{service}:{region}:{account}"
    if service == "s3":
        return [_s3(key, method, path, query)]
    if service == "sts":
        return []  # GetCallerIdentity needs no permission
    data = _json(body)
    if service == "glue":
        action = target.split(".")[-1]
        on_database = action in {"GetDatabase", "CreateDatabase"}
        db = (data.get("DatabaseName") or data.get("Name")) if on_database else data.get("DatabaseName")
        table = (data.get("TableInput") or {}).get("Name") or data.get("Name")
        resources = [f"{arn}:catalog"]
        if db:
            resources.append(f"{arn}:database/{db}")
        if table and not on_database:
            resources.append(f"{arn}:table/{db}/{table}")
        return [Call(key, service, f"glue:{action}", tuple(resources))]
    if service == "dynamodb":
        return [Call(key, service, f"dynamodb:{target.split('.')[-1]}", (f"{arn}:table/{data.get('TableName')}",))]
    if service == "events":
        action = target.split(".")[-1]
        if action != "PutEvents":
            return [Call(key, service, f"events:{action}", (f"{arn}:event-bus/default",))]
        return [
            Call(
                key,
                service,
                "events:PutEvents",
                (f"{arn}:event-bus/{entry.get('EventBusName') or 'default'}",),
                (("events:source", entry.get("Source", "")), ("events:detail-type", entry.get("DetailType", ""))),
            )
            for entry in data.get("Entries", [])
        ]
    if service == "sns":
        form = urllib.parse.parse_qs(body.decode())
        action = (form.get("Action") or [target.split(".")[-1]])[0]
        topic = (form.get("TopicArn") or [data.get("TopicArn", "")])[0]
        return [Call(key, service, f"sns:{action}", (topic,))]
    if service == "sqs":
        action = target.split(".")[-1] or urllib.parse.parse_qs(body.decode()).get("Action", ["?"])[0]
        queue = data.get("QueueUrl", "").rsplit("/", 1)[-1]
        return [Call(key, service, f"sqs:{action}", (f"{arn}:{queue}",))]
    if service == "eks":
        found = re.fullmatch(r"/clusters/([^/]+)", path)
        if method == "GET" and found:
            return [Call(key, service, "eks:DescribeCluster", (f"{arn}:cluster/{found.group(1)}",))]
    return [Call(key, service, f"unknown:{method} {path}", ())]


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _s3(key: str, method: str, path: str, query: dict[str, list[str]]) -> Call:
    bucket, _, obj = path.lstrip("/").partition("/")
    bucket_arn = f"arn:aws:s3:::{bucket}"
    if "notification" in query:
        action = "GetBucketNotification" if method == "GET" else "PutBucketNotification"
        return Call(key, "s3", f"s3:{action}", (bucket_arn,))
    if not obj:
        if method in {"GET", "HEAD"}:  # ListObjects(V2), HeadBucket
            prefix = query.get("prefix", [""])[0]
            return Call(key, "s3", "s3:ListBucket", (bucket_arn,), (("s3:prefix", prefix),))
        return Call(key, "s3", f"s3:{'CreateBucket' if method == 'PUT' else 'DeleteBucket'}", (bucket_arn,))
    action = {
        "GET": "GetObject",
        "HEAD": "GetObject",  # HeadObject is authorized as s3:GetObject
        "PUT": "PutObject",  # also UploadPart
        "POST": "PutObject",  # Create/CompleteMultipartUpload
        "DELETE": "AbortMultipartUpload" if "uploadId" in query else "DeleteObject",
    }[method]
    return Call(key, "s3", f"s3:{action}", (f"{bucket_arn}/{obj}",))


# ---------------------------------------------------------------------------------------------------
# evaluating
# ---------------------------------------------------------------------------------------------------
def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)


def _condition_holds(condition: dict[str, Any], context: dict[str, str]) -> bool:
    for operator, tests in condition.items():
        for context_key, expected in tests.items():
            actual = context.get(context_key)
            if actual is None:
                return False
            values = [str(v) for v in _as_list(expected)]
            if operator in {"StringEquals", "ArnEquals"} and actual not in values:
                return False
            if operator in {"StringLike", "ArnLike"} and not any(_like(v, actual) for v in values):
                return False
            if operator not in {"StringEquals", "ArnEquals", "StringLike", "ArnLike"}:
                raise ValueError(f"condition operator {operator} is not understood by this audit")
    return True


def allows(statements: Iterable[dict[str, Any]], call: Call) -> bool:
    """IAM's answer for one call: some Allow statement matches action, every resource and the conditions."""
    context = dict(call.context)
    allowed = False
    for statement in statements:
        actions = [a.lower() for a in _as_list(statement.get("Action", []))]
        if not any(_like(a, call.action.lower()) for a in actions):
            continue
        resources = [str(r) for r in _as_list(statement.get("Resource", []))]
        if not all(any(_like(r, res) for r in resources) for res in call.resources):
            continue
        if "Condition" in statement and not _condition_holds(statement["Condition"], context):
            continue
        if statement.get("Effect") == "Deny":
            return False
        allowed = True
    return allowed


def role_statements(stack: Any, role_logical_id: str) -> list[dict[str, Any]]:
    """Every statement of a role's inline policies, resolved for the stack."""
    props = stack.properties(role_logical_id)
    return [s for policy in props.get("Policies", []) for s in _as_list(policy["PolicyDocument"]["Statement"])]


def made_by_aws_as(stack: Any, role_logical_id: str, calls: Iterable[Call]) -> list[Call]:
    """The calls AWS services make with a role's credentials, which no code of ours sends (nor moto makes), derived
    from the stack and the role's own ``calls``:

    - Lambda sends an asynchronous event that used up its retries to the function's ``OnFailure`` destination as the
      function's execution role (an SQS queue: ``sqs:SendMessage`` on it);
    - SNS, given a message for a topic encrypted with a KMS key, asks KMS for a data key as the publisher
      (``kms:GenerateDataKey`` and ``kms:Decrypt`` on the key), for each topic the role published to.

    Their ``request`` is None: there is nothing to send again."""
    raw = stack.template["Resources"]
    made: list[Call] = []
    key = next((c.key for c in calls), "")
    for logical in stack.resources("AWS::Lambda::EventInvokeConfig"):
        function = raw[logical]["Properties"]["FunctionName"]["Ref"]
        if raw[function]["Properties"]["Role"]["Fn::GetAtt"][0] != role_logical_id:
            continue
        destination = stack.properties(logical).get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
        if destination:
            if not str(destination).startswith("arn:aws:sqs:"):
                raise ValueError(f"{logical}: an OnFailure destination this audit does not know: {destination}")
            made.append(Call(key, "sqs", "sqs:SendMessage", (str(destination),)))
    published = {r for c in calls if c.action == "sns:Publish" for r in c.resources}
    for logical in stack.resources("AWS::SNS::Topic"):
        encrypted_with = raw[logical]["Properties"].get("KmsMasterKeyId")
        if encrypted_with is None or stack.physical[logical] not in published:
            continue
        key_arn = stack.attributes[(encrypted_with["Ref"], "Arn")]
        made += [Call(key, "kms", action, (key_arn,)) for action in ("kms:GenerateDataKey", "kms:Decrypt")]
    return made


def denied(calls: Iterable[Call], statements: list[dict[str, Any]]) -> list[Call]:
    return sorted({c for c in calls if not allows(statements, c)}, key=str)


def granting(statements: list[dict[str, Any]], action: str) -> int:
    """The index of the one statement that grants ``action`` (by name, not by a wildcard)."""
    [index] = [i for i, s in enumerate(statements) if action in _as_list(s.get("Action", []))]
    return index


def without(statements: list[dict[str, Any]], index: int, action: str) -> list[dict[str, Any]]:
    """The statements with one action taken out of statement ``index`` (the statement gone if it was its only one)."""
    out = []
    for i, statement in enumerate(statements):
        if i == index:
            left = [a for a in _as_list(statement.get("Action", [])) if a != action]
            if not left:
                continue
            statement = {**statement, "Action": left}
        out.append(statement)
    return out


def necessity(
    calls: list[Call], statements: list[dict[str, Any]]
) -> tuple[dict[tuple[int, str], list[Call]], list[str]]:
    """Each granted action taken out in turn: the calls it alone allowed (what a role without it would be denied),
    by (statement index, action); and the grants no call needed (granted but unused, or allowed by another statement
    too)."""
    needed: dict[tuple[int, str], list[Call]] = {}
    unused: list[str] = []
    for i, statement in enumerate(statements):
        if statement.get("Effect") != "Allow":
            continue
        for action in _as_list(statement.get("Action", [])):
            lost = denied(calls, without(statements, i, action))
            if lost:
                needed[(i, action)] = lost
            else:
                unused.append(f"{action} (statement {i}: {statement.get('Sid', 'no Sid')})")
    return needed, unused
