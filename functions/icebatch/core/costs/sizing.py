"""Whether a model fits the GPU worker it would run on, told before any GPU node is bought.

The weights come from the model's own files, read where the engine would read them (``read_json``: a local
folder or an ``s3://`` prefix): the checkpoint's size from ``model.safetensors.index.json`` when there is one
(exact), else the parameter count from ``config.json`` (a decoder-only transformer's arithmetic). They are
held in GPU memory in the engine's dtype (``ICEBATCH_DTYPE``; ``auto``: 2 bytes a parameter on a GPU, as
vLLM's own default), split over ``ICEBATCH_TENSOR_PARALLEL_SIZE`` GPUs, and must leave vLLM room for its KV
cache: at most ``WEIGHTS_SHARE`` of what ``ICEBATCH_GPU_MEMORY_UTILIZATION`` lets it take of the smallest GPU
among the instance types that can host the worker. docs/deploy.md, "Sizing the GPU worker", has the arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from icebatch.core.costs.instances import INSTANCE_TYPES
from icebatch.core.settings import Settings

GIB = 1024**3
# what a GPU reports usable of its nominal memory (an L4 or an A10G: 23,034 MiB of 24 GiB; an L40S 46,068 of 48)
USABLE_SHARE = 0.937
WEIGHTS_SHARE = 0.9  # of vLLM's share of the GPU: the rest for activations and at least some KV cache
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}

ReadJson = Callable[[str], "dict[str, Any] | None"]  # a file of the model's folder, None when it has none


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    bytes_per_parameter: int
    source: str  # how the count was found

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.bytes_per_parameter


def decoder_parameters(config: dict[str, Any]) -> int:
    """A decoder-only transformer's parameters from its ``config.json`` (Llama, Mistral, Qwen and the like)."""
    text = config.get("text_config") or config  # a multimodal config nests the language model's
    hidden, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
    vocab, inter = int(text["vocab_size"]), int(text.get("intermediate_size") or 4 * hidden)
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q and o, k and v
    per_layer = attention + 3 * hidden * inter + 2 * hidden  # gated MLP, two norms
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + hidden


def model_size(read_json: ReadJson, dtype: str) -> ModelSize | None:
    """The model's parameters and the bytes each takes in the engine (None: no config.json to read)."""
    config = read_json("config.json")
    if config is None:
        return None
    stored = DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), 2)
    running = DTYPE_BYTES.get(dtype, 2)  # auto: vLLM keeps 16-bit weights and casts 32-bit ones down on a GPU
    index = read_json("model.safetensors.index.json")
    total = (index or {}).get("metadata", {}).get("total_size")
    if isinstance(total, int) and total > 0:
        return ModelSize(total // stored, running, "model.safetensors.index.json")
    return ModelSize(decoder_parameters(config), running, "config.json")


def gpu_memory_problem(settings: Settings, size: ModelSize, model: str) -> str | None:
    """Why the model cannot run on the GPU worker the settings describe, or None when it fits."""
    c, e = settings.cluster, settings.engine
    tp = e.tensor_parallel_size
    types = [INSTANCE_TYPES[t] for t in c.hosting_instance_types(tp) if t in INSTANCE_TYPES]
    if not types:
        return None  # types this project has no figures for: nothing to check against
    smallest = min(types, key=lambda t: t.gpu_memory_gib / t.gpus)
    per_gpu = smallest.gpu_memory_gib / smallest.gpus * GIB * USABLE_SHARE
    room = per_gpu * e.gpu_memory_utilization * WEIGHTS_SHARE
    need = size.weight_bytes / tp
    if need <= room:
        return None
    return (
        f"model {model!r} does not fit the GPU worker: {size.parameters / 1e9:.1f} B parameters x "
        f"{size.bytes_per_parameter} bytes = {size.weight_bytes / GIB:.1f} GiB of weights"
        f"{f' over {tp} GPUs' if tp > 1 else ''} ({size.source}), and a {smallest.name}'s {smallest.gpu} leaves "
        f"{room / GIB:.1f} GiB for them (x ICEBATCH_GPU_MEMORY_UTILIZATION={e.gpu_memory_utilization:g}, with room "
        "for the KV cache): allow bigger GPUs (ICEBATCH_GPU_INSTANCE_TYPES, e.g. g6e), raise "
        "ICEBATCH_TENSOR_PARALLEL_SIZE, or choose a smaller or quantized model"
    )
