"""The job's driver builds Ray Data LLM's pipeline without importing vLLM (its engine runs in actors)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

PROBE = textwrap.dedent(
    """
    import sys
    from icebatch_job.driver_imports import driver_imports

    with driver_imports():
        # what ray.data.llm.build_processor imports; ray.llm's errors module tries `import vllm`
        import ray.llm._internal.common.errors as errors
        from ray.llm._internal.batch.processor import vllm_engine_proc  # noqa: F401
        from ray.llm._internal.batch.stages import vLLMEngineStage  # noqa: F401
        loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
        print("inside:", [m for m in loaded if sys.modules[m] is not None], errors.VLLM_FATAL_ERRORS)
    import vllm.version  # importable again once the block ends
    print("after:", "vllm.version" in sys.modules)
    """
)


def test_building_the_engine_pipeline_never_imports_vllm_in_the_driver() -> None:
    # given a fresh process (the job's driver); when the engine stage's modules are imported the driver's way
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # then no vLLM module was loaded while building, and vLLM is importable afterwards
    assert "inside: [] ()" in done.stdout, done.stdout
    assert "after: True" in done.stdout
