"""The local backend's `ray-jobs` mode: a local Ray head started on demand, the job submitted through
Ray's job submission API, exactly as the launcher does it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch.tools.invoke import invoke
from icebatch.tools.local_backend import LocalBackend
from icebatch_job.example.tickets import ensure_source_table, generate
from icebatch_job.local.ray_instance import ray_temp_dir

from tests.engine.conftest import ledger

pytestmark = [pytest.mark.engine]


@pytest.fixture
def ray_jobs_settings(engine_settings: Settings) -> Iterator[Settings]:
    s = engine_settings.with_overrides(local_mode="ray-jobs")
    yield s
    stop_head(s)


@pytest.fixture
def decoy_on_ray_default_port() -> Iterator[list[str]]:
    """Another Ray on this machine, as a notebook's or another home's head looks to a job client on Ray's default
    port (8265): it answers the version check and records every other request. Where the port is taken, what
    holds it is the decoy already."""
    requests: list[str] = []

    class Decoy(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            requests.append(f"{self.command} {self.path}")
            found = self.path.startswith("/api/version")
            body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "decoy"}).encode()
            self.send_response(200 if found else 500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *_: object) -> None:
            pass

    try:
        server = ThreadingHTTPServer(("127.0.0.1", 8265), Decoy)
    except OSError:
        yield requests
        return
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield requests
    server.shutdown()
    server.server_close()


def stop_head(s: Settings) -> None:
    """Stop only the head this test started, with everything it spawned.

    Its own processes carry its temp dir on their command lines (through the short symlink or the real
    path); the workers and vLLM's engine processes (which rename themselves) are found as descendants.
    """
    import psutil

    markers = (ray_temp_dir(s), str(s.home / "ray"))
    roots = [
        p for p in psutil.process_iter(["cmdline"]) if any(m in " ".join(p.info["cmdline"] or []) for m in markers)
    ]
    victims = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    for p in victims.values():
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(victims.values()), timeout=10)
    for p in alive:  # gcs_server may ignore SIGTERM
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_ray_jobs_mode_starts_a_head_and_runs_the_job(
    ray_jobs_settings: Settings, decoy_on_ray_default_port: list[str]
) -> None:
    # given a table with a backlog, and another Ray answering on Ray's default port
    s = ray_jobs_settings
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=24, batches=2, seed=31)
    # when the launcher launches in ray-jobs mode
    [decision] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    # then the job goes to a head of the home's own, never to the other Ray
    assert decision["decision"] == "launch", decision["reason"]
    head = json.loads((s.home / "ray-head.json").read_text())["address"]
    assert decision["submission"] == f"submitted to Ray at {head}"
    assert not [r for r in decoy_on_ray_default_port if "/api/jobs" in r], decoy_on_ray_default_port
    # a duplicate launch while it runs is told so
    [again] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert again["decision"] in {"already_launched", "skip"}
    backend = LocalBackend(s)
    deadline = time.monotonic() + 600
    while True:
        [job] = [j for j in backend.list_jobs(s.top.deployment) if j.name == decision["job_name"]]
        if job.terminal or time.monotonic() > deadline:
            break
        time.sleep(3)
    logs = _job_logs(backend, decision["job_name"])
    assert job.succeeded, (job.failure_reason, logs)
    assert ledger(s).backlog().rows == 0, logs
    rows = ledger(s).results().scan().to_arrow()
    assert rows.num_rows == 24 and set(rows["run_id"].to_pylist()) == {decision["run_id"]}


def _job_logs(backend: LocalBackend, name: str) -> str:
    """The Ray job's own output (its terminal) and the run's full log under the home: what a failure is read from."""
    try:
        terminal = str(backend._client(start_head=False).get_job_logs(name))[-3000:]
    except Exception as e:  # the head is gone: the failure says so
        terminal = f"(no logs: {e})"
    full = sorted((backend.settings.home / "logs").glob("job-run-*.log"))
    return terminal + "\n--- " + ("\n".join(f"{p}:\n{p.read_text()[-3000:]}" for p in full) or "no run log")
