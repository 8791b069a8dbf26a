"""The engine's processes, forked from a warm server instead of each importing vLLM again.

vLLM runs its engine core, and on CPU a separate model worker, in processes of their own. In a Ray actor
vLLM starts them with ``spawn`` (forking a Ray worker is undefined behaviour: its threads and its
connections to the cluster do not survive a fork), so each is a fresh interpreter that imports vLLM
again: ~5 s each on CPU, one after the other, on the path to the first token.

The engine stage (``icebatch_job.stages.engine_stage``), before its actor imports vLLM, starts a
multiprocessing *fork server* (``multiprocessing.forkserver``: a fresh interpreter, not a Ray worker, so
nothing of Ray's in it) that imports vLLM's engine core (``icebatch_job.process.engine_preload``) while the
actor imports vLLM's front end. The engine core is forked from that server; in the engine core, a plain
process as under ``vllm serve``, the model worker is forked too (vLLM's own default outside Ray). Every
process started this way gets the environment its parent had when it started it, as with spawn (vLLM sets
variables while it builds its config), and dies with its parent (``icebatch_job.process.lineage``).

Only for an engine whose executor does not use Ray (``uni``, ``mp``: one device per replica); tensor or
pipeline parallelism over Ray keeps vLLM's ``spawn``. ``ICEBATCH_ENGINE_PROCESS_START=spawn`` (the engine
setting ``engine_process_start``) keeps vLLM's way for every engine.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from multiprocessing import forkserver
from multiprocessing.context import ForkContext, ForkProcess, ForkServerContext, ForkServerProcess
from typing import Any

from icebatch_job.process.lineage import die_with_parent

log = logging.getLogger(__name__)

PRELOAD_MODULE = "icebatch_job.process.engine_preload"
# the engine arguments' key Ray Data LLM fills with the executor it chose (its vLLMEngineStage)
EXECUTOR_KEY = "distributed_executor_backend"


class EnvironmentCarryingProcess(ForkServerProcess):
    """A fork server's process that runs with its parent's environment at ``start()``, as a spawned one would."""

    def start(self) -> None:
        self._parent_environment = dict(os.environ)
        super().start()

    def run(self) -> None:
        die_with_parent(owner=self._parent_pid)  # type: ignore[attr-defined]  # the fork server's death is its own
        _ready_for_process_titles()
        os.environ.clear()
        os.environ.update(self._parent_environment)
        super().run()


def _ready_for_process_titles() -> None:
    """Let setproctitle find this process's command line before the environment changes.

    vLLM names its processes with setproctitle ("VLLM::EngineCore", "VLLM::Worker"), which on first use
    looks for the memory of the command line and environment the process started with; once the environment
    has been rewritten it finds nothing and the names stay "python".
    """
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()


class EngineServerContext(ForkServerContext):
    """``multiprocessing``'s fork server context, whose processes carry their parent's environment."""

    Process = EnvironmentCarryingProcess


def omp_binding(environ: Mapping[str, str]) -> tuple[set[int] | None, int | None]:
    """The CPUs and OpenMP thread count the environment asks of a new process, as far as it says.

    vLLM's CPU backend binds each model worker by setting these variables around its start
    (``OMPProcessManager.configure_omp_envs``): ``OMP_NUM_THREADS`` and the worker's CPUs as ``OMP_PLACES``
    (``{0,1}``), ``GOMP_CPU_AFFINITY`` (``0 1``) or ``KMP_AFFINITY`` (``...,proclist=[0,1]``).
    """
    cpus: set[int] | None = None
    places = re.fullmatch(r"\{(\d+(?:,\d+)*)\}", environ.get("OMP_PLACES", "").strip())
    gomp = re.fullmatch(r"\d+(?: \d+)*", environ.get("GOMP_CPU_AFFINITY", "").strip())
    kmp = re.search(r"proclist=\[(\d+(?:,\d+)*)\]", environ.get("KMP_AFFINITY", ""))
    if places:
        cpus = {int(c) for c in places.group(1).split(",")}
    elif gomp:
        cpus = {int(c) for c in gomp.group(0).split()}
    elif kmp:
        cpus = {int(c) for c in kmp.group(1).split(",")}
    threads = environ.get("OMP_NUM_THREADS", "").strip()
    return cpus, int(threads) if threads.isdigit() and int(threads) > 0 else None


class BoundForkProcess(ForkProcess):
    """A forked process bound to the CPUs and OpenMP threads its environment asks for, as a spawned one would be.

    A spawned process's OpenMP runtime reads those variables when it loads; a forked one inherits a runtime
    that read them long before (in the fork server), so vLLM's binding of its model worker would be lost: on a
    CPU node the worker would run one thread (Ray's ``OMP_NUM_THREADS`` for the actor) on any core.
    """

    def run(self) -> None:
        die_with_parent(owner=self._parent_pid)  # type: ignore[attr-defined]  # its engine core's death is its own
        cpus, threads = omp_binding(os.environ)
        usable = (cpus or set()) & os.sched_getaffinity(0)
        if usable:
            os.sched_setaffinity(0, usable)  # the OpenMP threads this process starts inherit it
        elif cpus:  # places this machine does not have: OpenMP would ignore them too (with a warning)
            log.warning("OpenMP places %s are not among this process's CPUs; not binding it", sorted(cpus))
        torch = sys.modules.get("torch")  # not loaded: it reads the variables itself when it is
        if threads and torch is not None:
            torch.set_num_threads(threads)
        super().run()


class BoundForkContext(ForkContext):
    """``multiprocessing``'s fork context, whose processes are bound as the environment asks (``BoundForkProcess``)."""

    Process = BoundForkProcess


def process_start_on(device: str, setting: str) -> str:
    """How the engine's processes start on ``device`` for ICEBATCH_ENGINE_PROCESS_START=``setting``: ``auto`` is
    the fork server on CPU, where it was measured, and vLLM's spawn on a GPU, where it was not."""
    if setting != "auto":
        return setting
    return "forkserver" if device == "cpu" else "spawn"


def uses_fork_server(engine_kwargs: dict[str, Any], process_start: str) -> bool:
    """The engine's processes come from the fork server unless the setting says spawn or vLLM's executor is Ray."""
    return process_start == "forkserver" and engine_kwargs.get(EXECUTOR_KEY, "uni") != "ray"


def start_fork_server(preload: str = PRELOAD_MODULE) -> None:
    """Start this process's fork server, which imports ``preload`` before it forks anything (returns at once)."""
    forkserver.set_forkserver_preload([preload])
    forkserver.ensure_running()


def engine_processes_from_fork_server() -> bool:
    """Start the fork server and have vLLM launch its engine core from it; call before vLLM builds its engine.

    False (and vLLM's own spawn) if this vLLM launches its engine core some other way than the one patched.
    """
    start_fork_server()
    import vllm.v1.engine.utils as engine_utils  # what vLLM's engine build imports first anyway

    if not callable(getattr(engine_utils, "get_mp_context", None)):
        log.warning(
            "this vLLM does not start its engine core through vllm.v1.engine.utils.get_mp_context: its processes "
            "are spawned (each imports vLLM again); set ICEBATCH_ENGINE_PROCESS_START=spawn to silence this"
        )
        return False
    engine_utils.get_mp_context = EngineServerContext  # launch_core_engines: ``get_mp_context().Process(...)``
    return True
