"""The local backend's `ray-jobs` mode finds the home's own Ray head by its record (``ray-head.json``), and only if the
Ray answering there is that head: a head that is gone leaves its record, and its port may since be another Ray's.

The Ray here is an HTTP server answering Ray's job API version check as a head does (with its session's name):
what is tested is which head the backend trusts, not Ray."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from icebatch.core.settings import Settings
from icebatch.tools.local_backend import HEAD_RECORD, LocalBackend, own_head

pytestmark = pytest.mark.functional
SESSION = "session_2026-12-05_10-00-00_000000_4242"


@pytest.fixture
def ray_at() -> Iterator[tuple[str, list[str]]]:
    """A Ray job API on a free port whose version check names SESSION; every other request is answered 500 and
    recorded."""
    requests: list[str] = []

    class Head(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            version = self.path.startswith("/api/version")
            if not version:
                requests.append(f"{self.command} {self.path}")
            body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x", "session_name": SESSION})
            self.send_response(200 if version else 500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Head)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()


def _record_head(s: Settings, address: str) -> None:
    s.home.mkdir(parents=True, exist_ok=True)
    (s.home / HEAD_RECORD).write_text(json.dumps({"address": address, "temp_dir": str(s.home / "ray")}))


def _running_job(s: Settings, name: str) -> Path:
    """A job this home submitted to its head in ray-jobs mode, still RUNNING by its record."""
    (s.home / "jobs").mkdir(parents=True, exist_ok=True)
    path = s.home / "jobs" / f"{name}.json"
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(
        json.dumps(
            {
                "name": name,
                "deployment": s.top.deployment,
                "consumer": "triage",
                "attempt": 1,
                "mode": "ray-jobs",
                "status": "RUNNING",
                "start_time": started,
            }
        )
    )
    return path


def test_the_homes_head_is_trusted_when_it_answers_as_itself(settings: Settings, ray_at: tuple[str, list[str]]) -> None:
    # given a home whose head's session folder is in the home's Ray temp dir, answering where its record says
    address, _ = ray_at
    _record_head(settings, address)
    (settings.home / "ray" / SESSION).mkdir(parents=True)
    # then it is this home's head
    assert own_head(settings) == address


def test_another_ray_on_the_port_of_a_head_that_is_gone_is_never_used(
    settings: Settings, ray_at: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    # given a home whose head is gone (its record left behind), and another Ray since on that port
    address, requests = ray_at
    s = settings.with_overrides(local_mode="ray-jobs")
    _record_head(s, address)
    (s.home / "ray" / "session_2026-12-01_09-00-00_000000_1111").mkdir(parents=True)  # the old head's
    job = _running_job(s, "ib-triage-0123456789-a1")
    # when the launcher looks at its jobs
    [state] = LocalBackend(s).list_jobs(s.top.deployment)
    # then the job is known gone with its head, the other Ray was asked nothing about it, and the log says why
    assert (state.job_status, state.reason) == ("FAILED", "ClusterGone"), state
    assert json.loads(job.read_text())["status"] == "FAILED"
    assert requests == [], requests
    assert any("is not this home's head" in r.getMessage() for r in caplog.records)


def test_a_head_record_with_nothing_answering_is_no_head(settings: Settings) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on (bound, never listening)
        probe.bind(("127.0.0.1", 0))
        _record_head(settings, f"http://127.0.0.1:{probe.getsockname()[1]}")
        assert own_head(settings) is None
