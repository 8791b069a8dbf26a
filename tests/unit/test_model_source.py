"""A model named by a Hugging Face id is checked on the driver, before Ray starts, as local and s3:// ones are.

Without the check, an id the job cannot load (not cached while offline, a typo, a gated model, an
unreachable hub) surfaced only once Ray and the engine actor had started, as a page of traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from icebatch.core.errors import ModelUnavailableError, TransientError
from icebatch.core.settings import Settings
from icebatch_job.stages.model import check_model

pytestmark = pytest.mark.unit


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return Settings(home=tmp_path / "home")


def _cached(tmp_path: Path, repo: str) -> None:
    """``repo``'s config.json in the Hugging Face cache, laid out as huggingface_hub lays it out."""
    folder = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123abcd")
    (folder / "snapshots" / "0123abcd").mkdir(parents=True)
    (folder / "snapshots" / "0123abcd" / "config.json").write_text('{"model_type": "llama"}')


def test_an_id_that_is_not_cached_while_offline_names_the_cache_and_the_setting(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job that may not reach the hub, and a model it has never downloaded
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # when the driver checks the model, then it stops before Ray starts, saying where it looked and why
    with pytest.raises(ModelUnavailableError) as error:
        check_model(settings, "meta-llama/Llama-3.1-8B-Instruct")
    assert f"is not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'}) and HF_HUB_OFFLINE is set" in str(error.value)


def test_an_id_in_the_cache_is_taken_offline(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a model downloaded earlier into the job's cache, and no hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cached(tmp_path, "org/cached-model")
    # when the driver checks it, then it is there
    check_model(settings, "org/cached-model")


def test_an_unreachable_hub_is_transient(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a hub (here a mirror, HF_ENDPOINT) that refuses connections, and a model not in the cache
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    # when the driver checks it, then it is a dependency being down: retry later, or give the job a copy
    with pytest.raises(TransientError, match="could not reach the Hugging Face hub for model 'org/model'"):
        check_model(settings, "org/model")


def test_what_is_not_a_hub_id_says_so(settings: Settings) -> None:
    # given a source that looks remote but no hub id can be written so
    with pytest.raises(ModelUnavailableError, match="is not a Hugging Face id"):
        check_model(settings, "org/with space/x")
