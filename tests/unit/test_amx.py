"""The engine's model worker may use AMX tiles on a CPU that has them: vLLM's CPU attention uses them without
asking the kernel, which kills a process that has not asked (SIGILL) -- the model worker's silent death at its
first step on an AMX Xeon (``icebatch_job.process.amx``). The engine tier runs the real engine on this machine;
this checks the permission itself, with the kernel's own answer (``ARCH_GET_XCOMP_PERM``)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.core.settings import Settings
from icebatch_job.process.amx import EXTENSION
from icebatch_job.stages.pipeline import engine_config

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PERMITTED = """
import ctypes, sys
if sys.argv[1] == "import":
    import icebatch_job.process.amx  # what vLLM does in its model worker, given the extension
mask = ctypes.c_ulong(0)
ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask))  # arch_prctl(ARCH_GET_XCOMP_PERM)
print(bool(mask.value >> 18 & 1))  # XFEATURE_XTILEDATA
"""


def _permitted(step: str) -> bool:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT / "jobimage")])}
    done = subprocess.run(
        [sys.executable, "-c", PERMITTED, step], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    return done.stdout.strip() == "True"


def _has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="arch_prctl is Linux's")
def test_a_process_that_imports_the_worker_extension_may_use_amx_tiles_where_the_cpu_has_them() -> None:
    # given a fresh interpreter, which has not asked for AMX tiles
    assert _permitted("nothing") is False
    # when it imports the engine's worker extension (as vLLM's model worker does), then the kernel lets it use them
    # exactly where this CPU has them
    assert _permitted("import") is _has_amx()


def test_the_engine_is_given_the_extension_and_it_adds_nothing_to_vllms_worker(tmp_path: Path) -> None:
    # given the engine arguments the job builds for a CPU and for a GPU
    for device in ("cpu", "gpu"):
        kwargs = engine_config(Settings(home=tmp_path), "/models/m", device).engine_kwargs
        # then each names the extension, a class vLLM can mix into its worker: no attribute of its own to clash
        assert kwargs["worker_extension_cls"] == EXTENSION
        module, _, name = EXTENSION.rpartition(".")
        extension = getattr(importlib.import_module(module), name)
        assert [a for a in dir(extension) if not a.startswith("__")] == []
