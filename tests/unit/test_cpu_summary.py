"""A red engine test names its CPU: the summary its failure report carries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cpu import cpu_summary

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
XEON = "model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
EPYC_AVX2 = "model name\t: AMD EPYC 7R13\nflags\t\t: fpu sse4_2 avx2\n"


def test_the_summary_names_the_model_the_flags_that_matter_and_bf16() -> None:
    assert cpu_summary(XEON) == (
        "Intel(R) Xeon(R) Platinum 8488C; flags: avx2 avx512f avx512_bf16 amx_bf16 amx_tile; native bf16: yes"
    )
    assert cpu_summary(EPYC_AVX2) == "AMD EPYC 7R13; flags: avx2; native bf16: no"


def test_a_failed_engine_test_reports_its_cpu(tmp_path: Path) -> None:
    # given a conftest that turns the hook on as the engine tier's does, and a test that fails
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "engine" / "conftest.py").read_text().split("\n\n\n")[0])
    (tmp_path / "test_red.py").write_text("def test_red():\n    assert False\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "functions"), str(ROOT / "jobimage")])}
    # when it runs, then its failure report has a CPU section naming this machine's CPU
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "CPU" in done.stdout and cpu_summary() in done.stdout, done.stdout[-2000:]
