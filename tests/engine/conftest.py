from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import ResultsLedger, open_ledger
from icebatch.core.settings import Settings
from icebatch_job.process.runtime import init_ray, prepare_environment

from tests.support.consumers import consumers_file
from tests.support.cpu import pytest_runtest_makereport  # noqa: F401 (a red engine test names its CPU)


@pytest.fixture(scope="module")
def engine_settings(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Settings:
    """The embedded default with the session's tiny model and the triage consumer; one home per module."""
    home = tmp_path_factory.mktemp("home")
    triage_only = consumers_file(home / "consumers", {"name": "triage", "backlog_threshold": 1})
    return Settings(home=home, model_source=str(tiny_model), batch_size=32, consumers_file=triage_only)


def ledger(settings: Settings) -> ResultsLedger:
    """The ledger of the settings' one consumer."""
    return open_ledger(settings, consumer_named(load_consumers(settings), None))


def job_process_env(settings: Settings, consumers: Path) -> dict[str, str]:
    """The environment of ``python -m icebatch_job run`` as the engine tests start it: the home, the tiny model and
    these consumers, nothing of the test process's own."""
    return {
        "ICEBATCH_HOME": str(settings.home),
        "ICEBATCH_MODEL_SOURCE": str(settings.engine.model_source),
        "ICEBATCH_CONSUMERS_FILE": str(consumers),
        "ICEBATCH_BATCH_SIZE": "32",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HF_HUB_OFFLINE": "1",
    }


def read_events(settings: Settings) -> list[dict]:
    path = settings.home / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def own_settings(engine_settings: Settings, tmp_path: Path) -> Settings:
    """``engine_settings`` with a home of the test's own: its tickets, results and events alone, in any order."""
    return engine_settings.with_overrides(home=tmp_path / "home")


@pytest.fixture(scope="module")
def job_ray(engine_settings: Settings) -> Iterator[dict[str, str]]:
    """Ray as the job starts it (a local cluster), started for the module that asks, and ended after it."""
    import ray

    if ray.is_initialized():  # another module's in-process job left its cluster running
        ray.shutdown()
    env = prepare_environment(engine_settings, device="cpu")
    init_ray(engine_settings, env)
    yield env
    ray.shutdown()
