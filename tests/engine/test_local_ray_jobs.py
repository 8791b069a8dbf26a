"""The local backend's `ray-jobs` mode: a local Ray head started on demand, the job submitted through
Ray's job submission API, exactly as the launcher does it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch.tools.invoke import invoke
from icebatch.tools.local_backend import LocalBackend
from icebatch_job.example.tickets import ensure_source_table, generate
from icebatch_job.process.runtime import ray_temp_dir

from tests.engine.conftest import ledger

pytestmark = [pytest.mark.engine]


@pytest.fixture
def ray_jobs_settings(engine_settings: Settings) -> Iterator[Settings]:
    s = engine_settings.with_overrides(local_mode="ray-jobs")
    yield s
    stop_head(s)


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


def test_ray_jobs_mode_starts_a_head_and_runs_the_job(ray_jobs_settings: Settings) -> None:
    s = ray_jobs_settings
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=24, batches=2, seed=31)
    [decision] = invoke("launcher", {"trigger": "schedule"}, s)["decisions"]
    assert decision["decision"] == "launch", decision["reason"]
    assert decision["submission"].startswith("submitted to Ray at http://127.0.0.1:8265")
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
    assert job.succeeded, job.failure_reason
    assert ledger(s).backlog().rows == 0
    rows = ledger(s).results().scan().to_arrow()
    assert rows.num_rows == 24 and set(rows["run_id"].to_pylist()) == {decision["run_id"]}
