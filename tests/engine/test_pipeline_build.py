"""The engine pipeline as the job builds it on a small machine: no Ray process or stage it does not need.

On two cores every extra Ray worker process (a Python interpreter importing Ray) and every stage boundary
(each batch through the object store once more) is CPU taken from the engine (bench/README.md, "Where the job's
time goes"). Building the pipeline starts no engine, so these checks take seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.settings import Settings
from icebatch_job.commit.window import RowWindow, blocks_of
from icebatch_job.stages.pipeline import build_pipeline

pytestmark = [pytest.mark.engine]

TICKET = {"ticket_id": "t-1", "subject": "Charged twice", "body": "Refund?", "customer_tier": "pro", "channel": "email"}


def _built(settings: Settings) -> Any:
    import ray.data

    task = consumer_named(load_consumers(settings), "triage").task
    source = blocks_of(ray.data.from_items([TICKET]), settings.engine.batch_size)
    return build_pipeline(
        source, task, settings, window=RowWindow(256), run_id="r-1", model=settings.engine.model_source, device="cpu"
    )


def test_the_engine_pipeline_is_one_stage_of_ours_then_the_engine(engine_settings: Settings, job_ray: dict) -> None:
    # given the job's Ray; when the engine pipeline is built the job's way
    built = _built(engine_settings)
    # then after the read's blocks come two stages: ours (permits, prompts) and Ray Data LLM's vLLM stage.
    # No gate stage of its own, none of the processor's preprocess/postprocess maps (a Ray task per batch
    # each), no parse stage (the driver parses)
    stages = re.findall(r"(\w+\[|\w+\(\w*\))", repr(built.dataset))
    assert stages == ["MapBatches(EngineStageUDF)", "MapBatches(PromptStage)", "StreamingRepartition["], stages
    assert built.parse.data_column == "__data"


def test_the_build_starts_no_usage_telemetry_actor(engine_settings: Settings, job_ray: dict) -> None:
    import ray
    from ray.llm._internal.batch.observability.usage_telemetry.usage import LLM_BATCH_TELEMETRY_ACTOR_NAME

    # given the job's environment, usage stats off; when the engine pipeline is built
    assert job_ray["RAY_USAGE_STATS_ENABLED"] == "0"
    _built(engine_settings)
    # then Ray Data LLM started no (detached) telemetry actor, a worker process booted for tags never sent
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert LLM_BATCH_TELEMETRY_ACTOR_NAME not in names, names


def test_the_local_clusters_workers_get_the_job_environment_from_the_process(job_ray: dict) -> None:
    import ray

    # given a local cluster the job started; when a worker reads its environment
    @ray.remote(num_cpus=0)
    def environment(keys: list[str]) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in keys}

    seen = ray.get(environment.remote(sorted(job_ray)))
    # then it has the job's (caches under ICEBATCH_HOME, offline, KV cache size), inherited from the driver's
    # process rather than set through a runtime_env: workers Ray prestarted while it started can serve the job
    assert seen == job_ray
    assert not ray.get_runtime_context().runtime_env.get("env_vars")


def test_the_local_cluster_starts_no_head_process_it_has_no_use_for(job_ray: dict) -> None:
    import ray
    from ray._private import ray_constants

    # given a local cluster the job started (include_dashboard=False, workers' logs not forwarded)
    node = ray._private.worker.global_worker.node
    # then Ray started its GCS and raylet but no dashboard process (Ray 2.60 starts one anyway, with only its
    # usage-stats module, and waits for it before it starts the raylet), no autoscaler monitor (nothing to
    # scale on one machine; at the end it ignores ray.shutdown's SIGTERM for a whole second) and no log
    # monitor (it only forwards workers' logs to the driver)
    assert {ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET} <= set(node.all_processes)
    for idle in (
        ray_constants.PROCESS_TYPE_DASHBOARD,
        ray_constants.PROCESS_TYPE_MONITOR,
        ray_constants.PROCESS_TYPE_LOG_MONITOR,
    ):
        assert idle not in node.all_processes, sorted(node.all_processes)
    commands = _child_commands(os.getpid())
    assert commands  # the GCS and the raylet at least
    assert not [c for c in commands if b"dashboard/dashboard.py" in c], commands
    assert not [c for c in commands if re.search(rb"autoscaler/(_private|v2)/monitor\.py", c)], commands
    assert not [c for c in commands if b"log_monitor.py" in c], commands
    # and the cluster works
    assert ray.get(ray.remote(num_cpus=0)(lambda: 42).remote()) == 42


STATS_ON_PROBE = """
import sys
from pathlib import Path
import ray
from ray._private import ray_constants
from icebatch.core.settings import Settings
from icebatch_job.process.runtime import init_ray

init_ray(Settings(home=Path(sys.argv[1]), log_level=sys.argv[2]), {"RAY_USAGE_STATS_ENABLED": sys.argv[3]})
processes = ray._private.worker.global_worker.node.all_processes
print("dashboard process:", ray_constants.PROCESS_TYPE_DASHBOARD in processes)
print("monitor process:", ray_constants.PROCESS_TYPE_MONITOR in processes)
print("log monitor process:", ray_constants.PROCESS_TYPE_LOG_MONITOR in processes)
ray.shutdown()
"""


def _probe(home: Path, log_level: str, usage_stats: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", STATS_ON_PROBE, str(home), log_level, usage_stats],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_with_usage_stats_on_the_local_cluster_keeps_its_dashboard_process(tmp_path: Path) -> None:
    # given usage stats on (the dashboard process is what reports them); when the job starts its local cluster
    out = _probe(tmp_path, "INFO", "1")
    # then Ray starts it as usual (and still no autoscaler monitor: that does not depend on usage stats)
    assert "dashboard process: True" in out, out
    assert "monitor process: False" in out, out


def test_when_debugging_the_local_cluster_keeps_its_log_monitor(tmp_path: Path) -> None:
    # given ICEBATCH_LOG_LEVEL=DEBUG (the job forwards its workers' logs); when the job starts its local cluster
    out = _probe(tmp_path, "DEBUG", "0")
    # then the log monitor that forwards them runs
    assert "log monitor process: True" in out, out


def _child_commands(pid: int) -> list[bytes]:
    """The command lines of ``pid``'s live children."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append((entry / "cmdline").read_bytes())
        except OSError:  # it ended meanwhile
            continue
    return found
