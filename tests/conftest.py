from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from icebatch.core.settings import Settings

from tests.support.aws import client, glue_catalog_properties, moto_server

# Processes the tests start (CLI runs, Ray workers, vLLM) import this clone's code too: the venv is shared
# by every clone of the same lock, and its editable install points at whichever ran `make env` last.
ROOT = Path(__file__).resolve().parents[1]
CLONE_PATHS = [str(ROOT / "functions"), str(ROOT / "jobimage")]
os.environ["PYTHONPATH"] = os.pathsep.join([*CLONE_PATHS, *filter(None, [os.environ.get("PYTHONPATH")])])

# Keep every cache and temp dir of the libraries under one folder of the test session.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


@pytest.fixture(scope="session")
def aws_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The embedded default (SQLite catalog, file warehouse) under a fresh home."""
    return Settings(home=tmp_path / "home")


@pytest.fixture
def glue_settings(tmp_path: Path, aws_endpoint: str) -> Settings:
    """A Glue catalog with an S3 warehouse, both served by moto over HTTP."""
    bucket = f"wh-{uuid.uuid4().hex[:10]}"
    client("s3", aws_endpoint).create_bucket(Bucket=bucket)
    return Settings(
        home=tmp_path / "home",
        catalog_type="glue",
        catalog_properties=glue_catalog_properties(aws_endpoint, bucket),
        source_table=f"db_{uuid.uuid4().hex[:8]}.tickets",
    )


@pytest.fixture(params=["sql", "glue"])
def any_settings(request: pytest.FixtureRequest) -> Settings:
    """Each test runs on the SQL catalog and on the Glue catalog (moto server)."""
    name = "settings" if request.param == "sql" else "glue_settings"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.fixture
def cli_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For a command run in this process (``main([...])``): no ``ICEBATCH_*`` variable but a fresh
    ``ICEBATCH_HOME``; the harness's own (``ICEBATCH_TEST_SHUFFLE``, ``ICEBATCH_TEST_REPEAT``) are not
    settings, and the command would refuse them as it refuses any unknown one."""
    for name in [n for n in os.environ if n.startswith("ICEBATCH_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "cli-home"
    monkeypatch.setenv("ICEBATCH_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny random-weight Llama, built once per test session."""
    from icebatch_job.example.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


# --- make test-reliability: the concurrency tests, repeated and shuffled ---------------------------
# ICEBATCH_TEST_REPEAT=N runs every test N times; ICEBATCH_TEST_SHUFFLE=<seed> runs them in a random
# (seeded, printed) order: a test that passes only in file order, or only warm, fails here.
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    repeat = int(os.environ.get("ICEBATCH_TEST_REPEAT", "1"))
    if repeat > 1:
        metafunc.fixturenames.append("_repeat")
        metafunc.parametrize("_repeat", range(repeat), ids=lambda i: f"run{i + 1}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = os.environ.get("ICEBATCH_TEST_SHUFFLE")
    if seed:
        random.Random(int(seed)).shuffle(items)


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = os.environ.get("ICEBATCH_TEST_SHUFFLE")
    return f"test order shuffled with ICEBATCH_TEST_SHUFFLE={seed}" if seed else None
