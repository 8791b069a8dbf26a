"""The Performance page (docs/performance.md) says no more than the results do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import report

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("ratio", "shown"),
    [(0.9456, "0.946"), (0.9449, "0.94"), (0.95, "0.95"), (0.9501, "0.95"), (1.0349, "1.03"), (0.8622, "0.86")],
)
def test_a_ratio_that_two_places_would_round_across_the_goal_gets_three(ratio: float, shown: str) -> None:
    assert report.ratio_text(ratio) == shown


def _job_vs_bare(flags: list[str], dtype: str, ratio: float, bare_tok_s: float, model: str) -> dict[str, Any]:
    side = {"wall_s": 80.0, "first_token_s": 30.0, "generation_tok_per_s": bare_tok_s}
    return {
        "benchmark": "pipeline_vs_bare",
        "model": model,
        "rows": 2000,
        "runs": [{}, {}],
        "engine_dtype": dtype,
        "end_to_end_ratio": ratio,
        "end_to_end_ratio_spread": [ratio - 0.02, ratio + 0.02],
        "generation_ratio": 0.9,
        "median": {"bare": side, "job": side},
        "machine": {"cpus": 2, "cpu": {"model": "AMD EPYC", "flags": flags, "native_bf16": "avx512_bf16" in flags}},
    }


def _render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: dict[str, Any], small: dict[str, Any]) -> str:
    (tmp_path / "pipeline_vs_bare-latest.json").write_text(json.dumps(tiny))
    (tmp_path / "pipeline_vs_bare_small-latest.json").write_text(json.dumps(small))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    return report.render()


def test_the_small_models_pace_is_given_only_against_the_same_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the tiny model's results from an AVX-512 machine and the small model's from an AVX2-only one
    tiny = _job_vs_bare(["avx2", "avx512f", "avx512_bf16"], "auto", 0.9456, 6000.0, "tiny")
    small = _job_vs_bare(["avx2", "fma"], "float32", 0.96, 300.0, "small")
    # when the section is rendered
    text = _render(tmp_path, monkeypatch, tiny, small)
    # then the small row names its own machine instead of a pace between two machines
    assert "the tiny model's bare tok/s" not in text
    assert "measured on another machine: AMD EPYC (avx2, fma), engines in float32" in text
    # given both from one machine, the small (the headline) just under the goal, the tiny far under it and its job
    # 21 s later to its first token
    same = _job_vs_bare(["avx2", "avx512f", "avx512_bf16"], "auto", 0.9456, 600.0, "small")
    slow = _job_vs_bare(["avx2", "avx512f", "avx512_bf16"], "auto", 0.80, 6000.0, "tiny")
    slow["median"]["job"] = {**slow["median"]["job"], "first_token_s": 51.0}
    text = _render(tmp_path, monkeypatch, slow, same)
    # then the pace is given, and the ratio that misses the goal is not rounded onto it
    assert "0.10x the tiny model's bare tok/s" in text
    assert "**0.946**" in text and "misses its goal here (0.946 with the small model)" in text
    # and the tiny model's run is recorded, not held to the goal, with its start-up difference in seconds
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "the tiny model (1.4 M" in line)
    assert lines[at].endswith("| 0.80 (runs 0.78-0.82) | recorded |"), lines[at]
    assert lines[at + 1] == "| ... start-up, process start to first token | 30.0 s | 51.0 s | +21.0 s | |"
    # when the small run meets the goal, no goal is missed, whatever the tiny one's ratio
    text = _render(tmp_path, monkeypatch, slow, {**same, "end_to_end_ratio": 0.97})
    assert "misses" not in text
