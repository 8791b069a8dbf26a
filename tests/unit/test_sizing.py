"""A model is sized against the GPU worker before any GPU node is bought (icebatch.core.costs.sizing)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from icebatch.core.costs.sizing import decoder_parameters, gpu_memory_problem, model_size
from icebatch.core.settings import Settings

pytestmark = pytest.mark.unit

# the published config.json of each (only the fields the arithmetic reads, and their dtype)
LLAMA_31_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA_31_70B = {
    **LLAMA_31_8B,
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
}
LLAMA_32_1B = {
    **LLAMA_31_8B,
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "intermediate_size": 8192,
    "head_dim": 64,
    "tie_word_embeddings": True,
}
KUBERAY = Settings(backend="kuberay", eks_cluster="prod", model_source="s3://models/m/")


def files(**named: dict[str, Any]) -> Any:
    """A model folder holding these JSON files (``config``, ``index``)."""
    names = {"config": "config.json", "index": "model.safetensors.index.json"}
    contents = {names[k]: json.loads(json.dumps(v)) for k, v in named.items()}
    return contents.get


@pytest.mark.parametrize(
    ("config", "billions"), [(LLAMA_31_8B, 8.03), (LLAMA_31_70B, 70.55), (LLAMA_32_1B, 1.24)], ids=["8B", "70B", "1B"]
)
def test_a_decoders_parameters_are_counted_from_its_config(config: dict, billions: float) -> None:
    # given a published model's config; then the count is the one its model card gives
    assert decoder_parameters(config) / 1e9 == pytest.approx(billions, abs=0.01)


def test_the_checkpoints_own_size_wins_over_the_arithmetic_and_the_engines_dtype_decides_the_bytes() -> None:
    # given a model stored in float32 whose index says how big its checkpoint is
    stored_in_float32 = {**LLAMA_31_8B, "torch_dtype": "float32"}
    size = model_size(files(config=stored_in_float32, index={"metadata": {"total_size": 4_000}}), "auto")
    # then its parameters come from the index (4 bytes each as stored), held in 2 bytes each by the engine
    assert (size and (size.parameters, size.bytes_per_parameter, size.source)) == (
        1000,
        2,
        "model.safetensors.index.json",
    )
    assert model_size(files(config=LLAMA_31_8B), "float32").bytes_per_parameter == 4  # type: ignore[union-attr]
    assert model_size(files(), "auto") is None  # no config.json: nothing to size


def test_an_8b_model_fits_the_default_worker_and_a_70b_one_is_refused_with_the_ways_out() -> None:
    # given the default GPU worker (24 GB GPUs)
    eight = model_size(files(config=LLAMA_31_8B), "auto")
    seventy = model_size(files(config=LLAMA_31_70B), "auto")
    assert eight and seventy
    # then an 8B model in bfloat16 fits (15 GiB of weights) ...
    assert gpu_memory_problem(KUBERAY, eight, "s3://models/llama-3.1-8b/") is None
    # ... and a 70B one is refused, with its arithmetic and what to change
    problem = gpu_memory_problem(KUBERAY, seventy, "s3://models/llama-3.1-70b/")
    assert problem is not None
    assert "70.6 B parameters x 2 bytes = 131.4 GiB" in problem and "g6.xlarge's L4" in problem
    assert "ICEBATCH_GPU_INSTANCE_TYPES" in problem and "ICEBATCH_TENSOR_PARALLEL_SIZE" in problem
    # and the same 70B model over four L40S (tensor parallelism) fits
    four_l40s = KUBERAY.with_overrides(
        tensor_parallel_size=4, gpu_instance_types=["g6e.12xlarge"], worker_memory="64Gi", worker_cpu="8"
    )
    assert gpu_memory_problem(four_l40s, seventy, "s3://models/llama-3.1-70b/") is None
