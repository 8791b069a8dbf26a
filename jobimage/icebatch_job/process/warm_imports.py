"""The driver imports what the pipeline's build needs while Ray starts, instead of after.

``ray.init`` mostly waits for Ray's own processes; building Ray Data LLM's pipeline then imports
``ray.data.llm``, which imports torch and vLLM (Ray names vLLM's fatal errors from it): seconds of one core
that overlap that wait when a thread starts them first. Only public modules are imported, as the build would
import them anyway; a failure here is left for the build to report.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

BUILD_MODULES = ("ray.data.llm",)  # what ray.data.llm.build_processor needs (torch and vLLM come with it)


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the build imports it again and reports what is wrong
            log.debug("pre-import of %s failed: %r", name, e)
            return


@contextmanager
def imports_in_background(modules: tuple[str, ...] = BUILD_MODULES) -> Iterator[None]:
    """``modules`` imported on a thread for the block's length (it waits for them at the end)."""
    warm = threading.Thread(target=_import_all, args=(modules,), name="icebatch-driver-imports", daemon=True)
    warm.start()
    try:
        yield
    finally:
        warm.join()
