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
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

# what ray.data.llm.build_processor imports (measured with -X importtime), biggest first
BUILD_MODULES = (
    "torch",
    "transformers",
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


@contextmanager
def driver_imports(modules: tuple[str, ...] = BUILD_MODULES) -> Iterator[None]:
    """vLLM unimportable in this process, and ``modules`` imported in the background, for the block's length."""
    blocked = "vllm" not in sys.modules
    if blocked:
        sys.modules["vllm"] = None  # type: ignore[assignment]  # import -> ModuleNotFoundError (the import system's rule)
    warm = threading.Thread(target=_import_all, args=(modules,), name="icebatch-driver-imports", daemon=True)
    warm.start()
    try:
        yield
    finally:
        warm.join()
        if blocked and "vllm" in sys.modules and sys.modules["vllm"] is None:
            del sys.modules["vllm"]
