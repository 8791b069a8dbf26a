from __future__ import annotations

import json
from pathlib import Path

import pytest
from icebatch.settings import Settings


@pytest.fixture(scope="module")
def engine_settings(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Settings:
    """The embedded default with the session's tiny model; one home per test module."""
    return Settings(home=tmp_path_factory.mktemp("home"), model_source=str(tiny_model), batch_size=32)


def read_events(settings: Settings) -> list[dict]:
    path = settings.home_abs / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
