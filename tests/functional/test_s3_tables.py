"""A stack deployed with ``Catalog: s3tables`` talks to S3 Tables' Iceberg REST endpoint as AWS documents it.

moto has no Iceberg REST endpoint, so the endpoint here is an HTTP server on this machine that records what
pyiceberg's real REST client sends (and answers as S3 Tables does: config, a namespace that exists, a table
that does not, a create the caller may not make). The processes are started as a Lambda cold start would be:
the template's environment for an s3tables stack, the handlers' own catalog code, nothing imported before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support.cfn import Stack, load_template

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]
REGION = "eu-west-1"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        self.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
        path = self.path.split("?")[0].removeprefix("/iceberg")
        if path == "/v1/config":
            self._json(200, {"defaults": {}, "overrides": {}})
        elif path == "/v1/namespaces/support" and self.command in ("HEAD", "GET"):
            self._json(200 if self.command == "GET" else 204, {"namespace": ["support"], "properties": {}})
        elif self.command == "POST" and path == "/v1/namespaces/support/tables":  # createTable
            self._json(403, {"error": {"message": "not in this test", "type": "ForbiddenException", "code": 403}})
        else:
            self._json(404, {"error": {"message": "no such table", "type": "NoSuchTableException", "code": 404}})

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode() if self.command != "HEAD" and status != 204 else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/iceberg", seen
    finally:
        server.shutdown()
        server.server_close()


def _stack_environment(tmp_path: Path) -> dict[str, str]:
    """The functions' environment as an s3tables stack resolves it (Globals), plus what Lambda gives every
    function (credentials, region), with icebatch's home under the test's folder."""
    params = {
        "Catalog": "s3tables",
        "TableBucketName": "lake",
        "ClusterName": "c",
        "WarehouseBucket": "w",
        "ModelBucket": "m",
        "JobServiceAccount": "icebatch-job",
        "JobImage": "i",
    }
    template = load_template(ROOT / "template.yaml")
    env = Stack(template, "lake-stack", params, region=REGION).resolve(
        template["Globals"]["Function"]["Environment"]["Variables"]
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ICEBATCH_", "PYICEBERG_", "AWS_"))}
    return {
        **base,
        **{k: str(v) for k, v in env.items()},
        "ICEBATCH_HOME": str(tmp_path / "home"),
        "AWS_ACCESS_KEY_ID": "AKIDLAUNCHER",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
    }


_SCRIPT = """
import json
from icebatch.core.catalog import load_table, open_catalog
from icebatch.core.errors import TableNotFoundError
from icebatch.core.ledger import ResultsLedger
from icebatch.core.settings import Settings
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType
from tests.support.consumers import triage

settings = Settings.from_env()
catalog = open_catalog(settings, control_plane=True)
try:
    load_table(catalog, "support.tickets", what="source table", fix="create it")
    found = "loaded"
except TableNotFoundError as e:
    found = str(e)
try:
    ResultsLedger(catalog, triage(settings)).ensure_results_table(
        Schema(NestedField(1, "source_id", StringType(), required=True)))
    created = "created"
except Exception as e:
    created = type(e).__name__
print(json.dumps({"type": type(catalog).__name__, "found": found, "created": created}))
"""


def test_an_s3_tables_stack_signs_its_catalog_calls_for_s3tables_and_leaves_placement_to_it(
    tmp_path: Path, endpoint: tuple[str, list[dict[str, Any]]]
) -> None:
    uri, seen = endpoint
    # given the launcher's environment as an s3tables stack sets it, with the endpoint on this machine
    env = _stack_environment(tmp_path)
    assert env["PYICEBERG_CATALOG__S3TABLES__URI"] == f"https://s3tables.{REGION}.amazonaws.com/iceberg"
    env["PYICEBERG_CATALOG__S3TABLES__URI"] = uri
    # when it opens the catalog, loads the source table and creates a consumer's results table
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # then it is pyiceberg's REST catalog, which asked for the table bucket's configuration first
    assert out["type"] == "RestCatalog" and out["found"].startswith("source table"), out
    bucket = "arn:aws:s3tables:eu-west-1:123456789012:bucket/lake"
    assert seen[0]["path"] == "/iceberg/v1/config?" + urlencode({"warehouse": bucket})
    # and every call was signed with SigV4 for S3 Tables in the stack's region, with the function's credentials
    for request in seen:
        authorization = request["headers"].get("Authorization", "")
        assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDLAUNCHER/"), request
        assert f"/{REGION}/s3tables/aws4_request" in authorization, request
    # and the results table was asked for with no location of icebatch's (S3 Tables places its tables)
    [create] = [r for r in seen if r["method"] == "POST"]
    assert out["created"] == "ForbiddenError" and "location" not in json.loads(create["body"]), create["body"]
