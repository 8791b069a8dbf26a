"""The fault tier: the real job, as its own process tree, killed at chosen points (real vLLM behind HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from icebatch.core.settings import Settings
from icebatch_job.process.runtime import job_environment

from tests.support.consumers import consumers_file
from tests.support.fault_proxy import fault_proxy
from tests.support.vllm_server import vllm_openai_server


@dataclass(frozen=True)
class Endpoint:
    url: str  # the OpenAI-compatible base URL the job calls (through a counting proxy)
    counts: dict[str, int]  # "requests": every request that reached the server: work done, redone included


@pytest.fixture(scope="session")
def endpoint(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """vLLM's OpenAI server with the tiny model, behind a proxy that counts the requests it serves."""
    home = tmp_path_factory.mktemp("server")
    env = job_environment(Settings(home=home), device="cpu")
    with (
        vllm_openai_server(tiny_model, env, home / "vllm.log") as url,
        fault_proxy(url.removesuffix("/v1"), fail_first=0) as (proxy, counts),
    ):
        yield Endpoint(proxy + "/v1", counts)


@pytest.fixture
def job_settings(tmp_path: Path, endpoint: Endpoint) -> Settings:
    """The job in endpoint mode, small chunks, with the triage consumer."""
    home = tmp_path / "home"
    return Settings(
        home=home,
        engine_mode="endpoint",
        endpoint_url=endpoint.url,
        endpoint_model="tiny",
        endpoint_concurrency=4,
        batch_size=4,
        chunk_rows=72,  # 36 rows in flight (icebatch_job.stages.pipeline.in_flight_rows): a commit every 36 rows
        chunk_seconds=0,
        consumers_file=consumers_file(home / "consumers", {"name": "triage", "backlog_threshold": 1}),
    )
