"""The engine pipeline as the job builds it: our prompt stage, then Ray Data LLM's processor as its public API
builds it. Building the pipeline starts no engine, so these checks take seconds.
"""

from __future__ import annotations

import os
import re
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


def test_the_engine_pipeline_is_our_prompt_stage_then_ray_data_llms_processor(
    engine_settings: Settings, job_ray: dict
) -> None:
    # given the job's Ray; when the engine pipeline is built the job's way
    built = _built(engine_settings)
    # then after the read's blocks come our stage (permits, prompts) and the processor build_processor made,
    # as Ray Data LLM builds it: its preprocess map, its vLLM stage, its postprocess map (no parse stage: the
    # driver parses)
    stages = re.findall(r"(\w+\[|\w+\(\w*\))", repr(built.dataset))
    assert stages == [
        "Map(_postprocess)",
        "MapBatches(vLLMEngineStageUDF)",
        "Map(_preprocess)",
        "MapBatches(PromptStage)",
        "StreamingRepartition[",
    ], stages


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
