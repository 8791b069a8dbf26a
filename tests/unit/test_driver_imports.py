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
    from icebatch_job.process.driver_imports import driver_imports

    with driver_imports(usage_stats=sys.argv[2] != "0"):
        # what ray.data.llm.build_processor imports; ray.llm's errors module tries `import vllm`
        import ray.llm._internal.common.errors as errors
        from ray.llm._internal.batch.processor import vllm_engine_proc  # noqa: F401
        from ray.llm._internal.batch.stages import vLLMEngineStage  # noqa: F401
        # a copy: the driver's import thread may still be adding modules (iterating sys.modules itself is racy)
        loaded = sorted(m for m in sys.modules.copy() if m == "vllm" or m.startswith("vllm."))
        print("inside:", [m for m in loaded if sys.modules[m] is not None], errors.VLLM_FATAL_ERRORS)
        # what the build asks of transformers (the model's architecture, for Ray's usage telemetry)
        import transformers
        print("transformers inside:", type(transformers).__name__,
              transformers.AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=False).architectures,
              sorted(m for m in sys.modules.copy() if m.startswith("transformers.")))
        if type(transformers).__name__ == "ConfigOnlyTransformers":  # a hub id: no local config to read
            print("hub id:", transformers.AutoConfig.from_pretrained("org/model").architectures)
    import vllm.version  # importable again once the block ends
    print("after:", "vllm.version" in sys.modules)
    import transformers
    print("transformers after:", type(transformers).__name__, hasattr(transformers, "AutoTokenizer"))
    """
)


def _probe(model: str, usage_stats: str) -> subprocess.CompletedProcess[str]:
    """The probe in a fresh process (the job's driver), ``usage_stats`` as RAY_USAGE_STATS_ENABLED says."""
    command = [sys.executable, "-c", PROBE, model, usage_stats]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_building_the_engine_pipeline_never_imports_vllm_or_transformers_in_the_driver(tiny_model) -> None:  # type: ignore[no-untyped-def]
    # given a fresh process (the job's driver), usage stats off (the job's default); when the engine stage's
    # modules are imported the driver's way
    done = _probe(str(tiny_model), "0")
    assert done.returncode == 0, done.stderr[-2000:]
    # then no vLLM module was loaded while building, and vLLM is importable afterwards
    assert "inside: [] ()" in done.stdout, done.stdout
    assert "after: True" in done.stdout
    # and transformers was a reader of the model's config.json (the architecture the build asks for), none of
    # its modules imported; afterwards the real one imports
    assert "transformers inside: ConfigOnlyTransformers ['LlamaForCausalLM'] []" in done.stdout, done.stdout
    assert "hub id: []" in done.stdout, done.stdout
    assert "transformers after: _LazyModule True" in done.stdout, done.stdout


def test_with_usage_stats_on_the_build_gets_the_real_transformers(tiny_model) -> None:  # type: ignore[no-untyped-def]
    # given usage stats on (Ray's telemetry would send the architecture it reads); when the driver builds
    done = _probe(str(tiny_model), "1")
    assert done.returncode == 0, done.stderr[-2000:]
    # then transformers is the real one, and vLLM still is not imported
    assert "transformers inside: _LazyModule ['LlamaForCausalLM']" in done.stdout, done.stdout
    assert "inside: [] ()" in done.stdout, done.stdout


FINAL_ONLY_PROBE = textwrap.dedent(
    """
    import pickle, sys
    from icebatch.core.task import load_task
    from icebatch_job.stages.prompts import PromptStage

    stage = PromptStage(load_task(), sys.argv[1], 2048, True, data_column="__data")
    out = stage({"ticket_id": ["t-1", "t-2"], "subject": ["Charged twice", "x"], "body": ["Refund?", "y"],
                 "customer_tier": ["pro", "free"], "channel": ["email", "chat"],
                 "__icebatch_source_file": ["f.parquet"] * 2, "__icebatch_source_pos": [0, 1],
                 "__icebatch_source_hash": [7, 8]})
    print("prompt stage imported vllm:", "vllm" in sys.modules)
    rows = out["__data"]
    print("own sampling dicts:", rows[0]["sampling_params"] is not rows[1]["sampling_params"])
    row = pickle.loads(pickle.dumps(out["__data"][0]))  # what the engine's actor receives
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    sampling = dict(row["sampling_params"])
    sampling.pop("structured_outputs")
    params = SamplingParams(**sampling)
    print("final only:", params.output_kind is RequestOutputKind.FINAL_ONLY, "detokenize:", params.detokenize)
    """
)


def test_the_engine_is_asked_for_final_outputs_only_without_vllm_in_the_prompt_stage(tiny_model) -> None:  # type: ignore[no-untyped-def]
    # given the prompt stage of an engine run (a process without vLLM); when it builds a row's request and the
    # row reaches the engine's actor (pickled, as Ray moves it)
    done = subprocess.run(
        [sys.executable, "-c", FINAL_ONLY_PROBE, str(tiny_model)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # then the prompt stage never imported vLLM, and the engine builds SamplingParams that return only the final
    # output (as vllm.LLM does): no per-token output objects and wake-ups in the engine's front end, and no
    # detokenizing as tokens arrive (the engine's actor decodes each answer once: icebatch_job.stages.engine_outputs)
    assert "prompt stage imported vllm: False" in done.stdout, done.stdout
    assert "final only: True detokenize: False" in done.stdout, done.stdout
    # and each row has its own sampling dict (the engine pops keys from it; rows may travel as one pickle)
    assert "own sampling dicts: True" in done.stdout, done.stdout
