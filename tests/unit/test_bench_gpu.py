"""``make bench-gpu`` where it cannot run: one line saying why, a non-zero exit, nothing started."""

from __future__ import annotations

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
