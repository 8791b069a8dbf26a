"""``make bench-gpu`` where it cannot run: one line saying why, a non-zero exit, nothing started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _bench_gpu(path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_without_a_gpu_it_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    # given a machine with no nvidia-smi on its PATH
    done = _bench_gpu(str(tmp_path))
    # then one line on stderr says why, and nothing was written
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "bench-gpu: no NVIDIA GPU here (nvidia-smi not found); run it in the job image on a GPU node"
    ]
    assert done.stdout == ""


def test_a_gpu_that_this_torch_cannot_use_is_one_line_too(tmp_path: Path) -> None:
    # given an nvidia-smi that lists a GPU, and this machine's CPU build of torch
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA L40S, 46068 MiB'\n")
    smi.chmod(0o755)
    done = _bench_gpu(f"{tmp_path}:{os.environ['PATH']}")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "bench-gpu: this Python's torch cannot use the GPU (a CPU build?); run it in the job image"
    ]


@pytest.mark.parametrize("which", ["gpu", "small"])
def test_a_random_weight_model_builds_the_jobs_prompts(
    which: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU bench's Llama-3.1-8B shape and ``pipeline_vs_bare --model small`` run the job's prompt stage:
    their folders need the tiny model's chat template, not only its tokenizer."""
    from icebatch.core.task import load_task
    from icebatch_job.stages.prompts import PromptBuilder
    from transformers import AutoTokenizer

    from bench import gpu, pipeline_vs_bare

    # given the tiny model as the deployment's model; when a bench builds its random-weight model folder
    monkeypatch.setenv("ICEBATCH_MODEL_SOURCE", str(tiny_model))
    folder = gpu.build_model(tmp_path / "m") if which == "gpu" else Path(pipeline_vs_bare.small_model(tmp_path))
    # then the job's prompt builder renders a ticket with the tokenizer found there
    tokenizer = AutoTokenizer.from_pretrained(folder)
    builder = PromptBuilder(load_task(), tokenizer, max_model_len=2048)
    assert tokenizer.decode(builder._ids(TICKET)).startswith("<s><|system|>")
    # and the small shape keeps the tiny model's vocabulary (its outputs are detokenized and parsed)
    if which == "small":
        config = json.loads((folder / "config.json").read_text())
        assert config["vocab_size"] == json.loads((tiny_model / "config.json").read_text())["vocab_size"]
        assert config["hidden_size"] == pipeline_vs_bare.SMALL_SHAPE["hidden_size"]


TICKET = {"subject": "Export fails", "body": "CSV export times out.", "customer_tier": "pro", "channel": "email"}
