"""The driver's start-up: build the engine pipeline's Python while Ray starts, and never import vLLM.

The driver only *builds* the Ray Data LLM pipeline; vLLM runs in the engine stage's actors, each its own
process. Left alone, the driver would still import vLLM (``ray.llm._internal.common.errors`` tries it, to
name vLLM's fatal errors) plus torch and transformers, all after Ray has started and before the pipeline
can execute: ~4-6 s of one core on the path to the engine's first token, and as much CPU taken from the
engine actor's own start on a small machine (measured on 2 cores: ``bench.pipeline_vs_bare``).

``driver_imports()`` (around Ray's start and the pipeline's build) makes ``import vllm`` fail in this
process, so that Ray's optional import is skipped, and imports what the build needs on a thread while
``ray.init`` waits for Ray's processes. When it ends, vLLM is importable again (an in-process caller, a
test, may need it later); Ray's table of vLLM's fatal errors stays empty in this process, which is right:
no engine runs here.

Nor is transformers, with usage stats off (the job's default): ~4 s of one core on 2 cores, while Ray's own
processes start. The build imports it only to read the model's architecture for Ray's usage telemetry
(``AutoConfig.from_pretrained(path).architectures``), which with usage stats off is never sent. For the
block's length ``transformers`` is a module that answers that from a local model's ``config.json``
(``ConfigOnlyTransformers``; none for a hub id); afterwards the real one is importable again. With usage
stats on, the build gets the real one. Torch stays: the module defining Ray's engine stage imports it.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# what ray.data.llm.build_processor imports (measured with -X importtime), biggest first
BUILD_MODULES = (
    "torch",
    "ray.data.llm",
    "ray.llm._internal.batch.processor.vllm_engine_proc",
    "ray.llm._internal.batch.stages",
    "ray.llm._internal.common.utils.download_utils",
)


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the build imports it again and reports what is wrong
            log.debug("pre-import of %s failed: %r", name, e)
            return


class _AutoConfig:
    """``transformers.AutoConfig`` as far as the build uses it: a local model's ``config.json``, as attributes."""

    @staticmethod
    def from_pretrained(path: str, **_kwargs: Any) -> types.SimpleNamespace:
        config = Path(path) / "config.json"
        return types.SimpleNamespace(**json.loads(config.read_text())) if config.is_file() else _NO_ARCHITECTURE


_NO_ARCHITECTURE = types.SimpleNamespace(architectures=[])  # Ray's telemetry then names its default


class ConfigOnlyTransformers(types.ModuleType):
    """Stands in for ``transformers`` in the driver while it builds the pipeline (module docstring)."""

    AutoConfig = _AutoConfig

    def __init__(self) -> None:
        super().__init__("transformers", "icebatch: the driver's build reads a model's config.json, nothing else")


@contextmanager
def driver_imports(*, usage_stats: bool, modules: tuple[str, ...] = BUILD_MODULES) -> Iterator[None]:
    """vLLM unimportable and (``usage_stats`` off) transformers a config reader in this process, and
    ``modules`` imported in the background, for the block's length."""
    stand_ins: dict[str, types.ModuleType | None] = {"vllm": None}
    if not usage_stats:  # what transformers would tell the build is never sent
        stand_ins["transformers"] = ConfigOnlyTransformers()
    placed = {name: module for name, module in stand_ins.items() if name not in sys.modules}
    sys.modules.update(placed)  # type: ignore[arg-type]  # None: import -> ModuleNotFoundError (the import system's rule)
    warm = threading.Thread(target=_import_all, args=(modules,), name="icebatch-driver-imports", daemon=True)
    warm.start()
    try:
        yield
    finally:
        warm.join()
        for name, module in placed.items():
            if name in sys.modules and sys.modules[name] is module:
                del sys.modules[name]
