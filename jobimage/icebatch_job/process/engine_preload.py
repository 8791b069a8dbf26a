"""Imported by the engine's fork server (``icebatch_job.process.engine_processes``), never by the job's driver.

It imports vLLM's engine core once, so that every process forked from the server starts with it, and has
the engine core fork its model worker (vLLM's default in a process that is not a Ray worker; vLLM's CPU
platform asks for spawn) unless CUDA is initialized in it, where vLLM's own choice stands. The forked worker
is bound to the CPUs and OpenMP threads vLLM sets for it, as a spawned one is (``BoundForkProcess``).

The fork server dies with the process that started it (the engine's actor): ``icebatch_job.process.lineage``.
"""

from __future__ import annotations

from multiprocessing.context import BaseContext

import vllm.v1.engine.core  # noqa: F401  # the engine core's code, for every process forked from the server
import vllm.v1.executor.multiproc_executor as multiproc_executor
from vllm.utils.platform_utils import cuda_is_initialized
from vllm.utils.system_utils import get_mp_context as vllm_mp_context

from icebatch_job.process.engine_processes import BoundForkContext
from icebatch_job.process.lineage import die_with_parent
from icebatch_job.process.shared_memory import unlink_shared_memory_once_attached

die_with_parent()  # the fork server: killed by the kernel when the engine's actor ends, however it ends


def worker_mp_context() -> BaseContext:
    """How the engine core starts its model workers: forked and bound to the CPUs and OpenMP threads vLLM sets
    for them, unless CUDA is initialized (then vLLM decides)."""
    if cuda_is_initialized():
        return vllm_mp_context()
    return BoundForkContext()


multiproc_executor.get_mp_context = worker_mp_context
unlink_shared_memory_once_attached()  # for the engine core and the model worker, both forked from here
