"""A small Kubernetes API server for ``rayjobs.ray.io``, over real HTTP, for the real kubernetes client.

No API server can be installed on this machine, so this one implements what the launcher and the
reconciler use — list (with label selectors), create, get, merge-patch, delete — with the API server's
status codes and Status bodies: 201, 200, 401 (bad token), 403 (RBAC), 404, 409 (AlreadyExists), 422
(strict schema validation against the KubeRay CRD). Bearer tokens are checked the way EKS checks them:
the presigned STS URL inside is called (against moto's STS) and must sign the ``x-k8s-aws-id`` header.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from icebatch.control.backends.eks_auth import CLUSTER_HEADER, TOKEN_PREFIX

from tests.support.crd import errors as crd_errors
from tests.support.tls import ServerCert

PREFIX = "/apis/ray.io/v1/namespaces/"


# The hosts EKS (aws-iam-authenticator) accepts in a token's presigned URL: real STS endpoints only.
TOKEN_SECONDS = 15 * 60  # how long EKS takes a token from its signing
STS_HOST = re.compile(r"^sts(\.[a-z0-9-]+)?\.amazonaws\.com(\.cn)?$")


def sts_token_verifier(
    cluster: str, sts_endpoint: str, sessions: dict[str, dict[str, str]] | None = None
) -> Callable[[str], str]:
    """Verify an EKS token as EKS does: a real STS host, a signed ``x-k8s-aws-id``, then call the URL.

    The call goes to ``sts_endpoint`` (moto's STS in tests) with the token's own path and query. moto's
    server picks the service from an ``Authorization`` header's credential scope and ignores the host, so
    a query-signed URL would land on its S3 backend; the URL's own credential and signature are restated
    as a header to route it to STS (moto does not check signatures where IAM is not enforced).

    Where it is (``tests.support.aws.enforced_iam``), moto checks every signature as a header's, which a query
    signature is not: ``sessions`` (access key id -> the session's credentials, as ``tests.support.aws.assume``
    gives them) then lets the verifier check the URL's signature itself, as STS does, and ask moto who the session
    is with a call of its own, signed with it. A token of an unknown key is refused.
    """

    def verify(token: str) -> str:
        url = urllib.parse.urlsplit(decode_token(token))
        if url.scheme != "https" or not STS_HOST.match(url.hostname or ""):
            raise PermissionError(f"token is not signed for a real STS endpoint: {url.scheme}://{url.netloc}")
        query = urllib.parse.parse_qs(url.query)
        signed = query.get("X-Amz-SignedHeaders", [""])[0].split(";")
        if CLUSTER_HEADER not in signed:
            raise PermissionError("token does not sign x-k8s-aws-id")
        if query.get("Action") != ["GetCallerIdentity"]:
            raise PermissionError("token is not a GetCallerIdentity call")
        if sessions is not None:
            return _identity_of_a_known_session(url, cluster, sts_endpoint, sessions)
        routing = (
            f"AWS4-HMAC-SHA256 Credential={query['X-Amz-Credential'][0]}, "
            f"SignedHeaders={query['X-Amz-SignedHeaders'][0]}, Signature={query['X-Amz-Signature'][0]}"
        )
        target = f"{sts_endpoint.rstrip('/')}{url.path or '/'}?{url.query}"
        request = urllib.request.Request(target, headers={CLUSTER_HEADER: cluster, "Authorization": routing})
        with urllib.request.urlopen(request, timeout=10) as r:
            body = r.read().decode()
        if "<Arn>" not in body:
            raise PermissionError("STS did not identify the caller")
        return body.split("<Arn>", 1)[1].split("</Arn>", 1)[0]

    return verify


def _identity_of_a_known_session(
    url: urllib.parse.SplitResult, cluster: str, sts_endpoint: str, sessions: dict[str, dict[str, str]]
) -> str:
    """STS's check of a presigned URL (SigV4 query signing, botocore's), then moto's answer to the session."""
    import boto3
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
    query = dict(pairs)
    key, _, region, service, _ = query["X-Amz-Credential"].split("/")
    session = sessions.get(key)
    if session is None or query.get("X-Amz-Security-Token") != session.get("AWS_SESSION_TOKEN"):
        raise PermissionError(f"token signed by an unknown session ({key[:24]})")
    # as aws-iam-authenticator: 15 minutes from its signing, whatever X-Amz-Expires says (STS ignores it for this call)
    signed_at = datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    if (datetime.now(UTC) - signed_at).total_seconds() > TOKEN_SECONDS:
        raise PermissionError("token expired")
    unsigned = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    request = AWSRequest(
        "GET",
        urllib.parse.urlunsplit(url._replace(query=urllib.parse.urlencode(unsigned, quote_via=urllib.parse.quote))),
        headers={CLUSTER_HEADER: cluster},
    )
    request.context["timestamp"] = query["X-Amz-Date"]
    secret, session_token = session["AWS_SECRET_ACCESS_KEY"], session["AWS_SESSION_TOKEN"]
    auth = SigV4QueryAuth(Credentials(key, secret, session_token), service, region)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if expected != query["X-Amz-Signature"]:
        raise PermissionError("token's signature does not match (or it signs another cluster)")
    sts = boto3.client(
        "sts",
        endpoint_url=sts_endpoint,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=session_token,
    )
    return str(sts.get_caller_identity()["Arn"])


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v.lstrip("="):
                return False
        elif labels.get(term) is None:
            return False
    return True


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v
    return target


def decode_token(token: str) -> str:
    """The presigned STS URL inside a bearer token: what EKS verifies, and so does this server."""
    if not token.startswith(TOKEN_PREFIX):
        raise ValueError("not an EKS token")
    body = token[len(TOKEN_PREFIX) :]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


class RayJobApi:
    def __init__(
        self,
        *,
        namespaces: set[str] | None = None,
        crd_version: str = "v1.7.0",
        verify_token: Callable[[str], str] | None = None,
        forbidden_namespaces: set[str] | None = None,
    ) -> None:
        self.namespaces = namespaces or {"icebatch"}
        self.crd_version = crd_version
        self.verify_token = verify_token
        self.forbidden = forbidden_namespaces or set()
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, int]] = []
        self.identities: list[str] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        # called with each RayJob once it is stored, before the client has the answer (a test's hook: the client
        # killed at that moment has created the job without knowing it)
        self.on_create: Callable[[dict[str, Any]], None] | None = None

    # --- test helpers --------------------------------------------------------------------------
    def set_status(self, name: str, namespace: str = "icebatch", **status: Any) -> None:
        """What the KubeRay operator would do: update a job's status."""
        with self.lock:
            self.objects[(namespace, name)].setdefault("status", {}).update(status)

    def names(self, namespace: str = "icebatch") -> list[str]:
        with self.lock:
            return sorted(n for ns, n in self.objects if ns == namespace)

    def created(self) -> int:
        return sum(1 for method, _, code in self.requests if method == "POST" and code == 201)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self, tls: ServerCert | None = None) -> str:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_PATCH(self) -> None:
                self._dispatch("PATCH")

            def do_DELETE(self) -> None:
                self._dispatch("DELETE")

            def _dispatch(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                code, payload = api.handle(method, self.path, self.headers, body)
                with api.lock:
                    api.requests.append((method, self.path, code))
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        scheme = "http"
        if tls is not None:  # as EKS serves it: HTTPS with the cluster's own CA
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.cert_file, tls.key_file)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- the API -------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        parsed = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(parsed.query)
        if self.verify_token is not None:
            auth = headers.get("Authorization", "")
            try:
                identity = self.verify_token(auth.removeprefix("Bearer ").strip())
            except Exception as e:
                return 401, _status(401, "Unauthorized", f"invalid bearer token: {e}")
            with self.lock:
                self.identities.append(identity)
        if not parsed.path.startswith(PREFIX):
            return 404, _status(404, "NotFound", f"the server could not find the requested resource {parsed.path}")
        parts = parsed.path[len(PREFIX) :].split("/")
        if len(parts) < 2 or parts[1] != "rayjobs":
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        namespace, name = parts[0], (parts[2] if len(parts) > 2 else None)
        if namespace in self.forbidden:
            verb = {
                "GET": "list" if name is None else "get",
                "POST": "create",
                "PATCH": "patch",
                "DELETE": "delete",
            }[method]
            return 403, _status(
                403,
                "Forbidden",
                f'rayjobs.ray.io is forbidden: User "icebatch-launcher" cannot {verb} resource "rayjobs" in API '
                f'group "ray.io" in the namespace "{namespace}"',
            )
        if namespace not in self.namespaces:
            return 404, _status(404, "NotFound", f'namespaces "{namespace}" not found')
        with self.lock:
            if method == "GET" and name is None:
                selector = query.get("labelSelector", [""])[0]
                items = [
                    o
                    for (ns, _), o in sorted(self.objects.items())
                    if ns == namespace and _matches(o["metadata"].get("labels", {}), selector)
                ]
                return 200, {"apiVersion": "ray.io/v1", "kind": "RayJobList", "metadata": {}, "items": items}
            if method == "POST" and name is None:
                return self._create(namespace, body, query)
            if name is None:
                return 405, _status(405, "MethodNotAllowed", "method not allowed")
            obj = self.objects.get((namespace, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'rayjobs.ray.io "{name}" not found')
            if method == "GET":
                return 200, obj
            if method == "PATCH":
                ctype = headers.get("Content-Type", "")
                if "merge-patch" not in ctype and "strategic-merge-patch" not in ctype:
                    return 415, _status(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
                _merge(obj, json.loads(body or b"{}"))
                obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
                return 200, obj
            if method == "DELETE":
                del self.objects[(namespace, name)]
                return 200, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Success",
                    "details": {"name": name},
                }
        return 405, _status(405, "MethodNotAllowed", "method not allowed")

    def _create(self, namespace: str, body: bytes, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        try:
            obj = json.loads(body)
        except ValueError:
            return 400, _status(400, "BadRequest", "the request body is not JSON")
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return 422, _status(422, "Invalid", "RayJob.ray.io is invalid: metadata.name: Required value")
        if query.get("fieldValidation", [""])[0] == "Strict":
            problems = crd_errors(obj, self.crd_version)
            if problems:
                return 422, _status(422, "Invalid", f'RayJob.ray.io "{name}" is invalid: ' + "; ".join(problems[:5]))
        if (namespace, name) in self.objects:
            return 409, _status(409, "AlreadyExists", f'rayjobs.ray.io "{name}" already exists')
        obj["metadata"].update(
            namespace=namespace,
            uid=str(uuid.uuid4()),
            resourceVersion="1",
            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        obj["status"] = {"jobDeploymentStatus": "Initializing"}
        self.objects[(namespace, name)] = obj
        if self.on_create is not None:
            self.on_create(obj)
        return 201, obj
