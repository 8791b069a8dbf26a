"""The job's process environment: caches under ICEBATCH_HOME, offline model loading, Ray start-up.

vLLM, torch, inductor, Hugging Face and Ray write to ``~/.cache``, ``~/.ray`` and ``/tmp`` unless told
otherwise. ``prepare_environment`` points all of them under ``$ICEBATCH_HOME/cache`` (and Ray's temp dir
under ``$ICEBATCH_HOME/ray``) before any of those libraries is imported, and returns the same variables
for Ray's ``runtime_env`` so that workers see them too.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

from icebatch.core.settings import Settings

from icebatch_job.process.lineage import adopt_orphans, end_descendants
from icebatch_job.process.reaper import start_reaper
from icebatch_job.process.shared_memory import (
    record_shared_memory,
    sweep_abandoned_records,
    unlink_recorded_shared_memory,
)

log = logging.getLogger(__name__)


def is_remote_model(source: str) -> bool:
    """An object-store prefix or a hub id (``org/name``), as opposed to a local folder."""
    return source.startswith(("s3://", "gs://", "hf://")) or (not source.startswith(("/", ".")) and "/" in source)


def job_environment(settings: Settings, *, device: str, model: str | None = None) -> dict[str, str]:
    """Environment variables the job's processes (driver and Ray workers) need (``model``: the run's)."""
    cache = settings.home / "cache"
    env = {
        "XDG_CACHE_HOME": str(cache),
        "HF_HOME": str(cache / "huggingface"),
        "TORCH_HOME": str(cache / "torch"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "DEBUG" if settings.top.log_level.upper() == "DEBUG" else "WARNING",
    }
    source = model or settings.engine.model_source
    if source is None or not is_remote_model(source) or source.startswith("s3://"):
        env["HF_HUB_OFFLINE"] = "1"
    # Ray Data LLM's model downloader and the run:ai streamer build their own S3 clients from the environment
    if settings.aws.aws_region:
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = settings.aws.aws_region
    if settings.aws.aws_endpoint_url:
        env["AWS_ENDPOINT_URL_S3"] = env["RUNAI_STREAMER_S3_ENDPOINT"] = settings.aws.aws_endpoint_url
        env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.engine.kv_cache_gib:g}"
    return env


def prepare_environment(settings: Settings, *, device: str = "cpu", model: str | None = None) -> dict[str, str]:
    """Export the job environment into this process (explicit values already set win)."""
    env = job_environment(settings, device=device, model=model)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    (settings.home / "cache").mkdir(parents=True, exist_ok=True)
    return {k: os.environ[k] for k in env}


@contextmanager
def quiet_handler_records(log_level: str) -> Iterator[None]:
    """While a command runs on this machine, the Lambda handlers it calls in-process (the local reporter after
    a job, the launcher behind `icebatch launch` and `invoke`) keep their JSON records to themselves unless
    asked (``-v``, ICEBATCH_LOG_LEVEL=DEBUG): on a terminal they fell between the command's own lines. Their
    warnings and errors still show; an explicit POWERTOOLS_LOG_LEVEL wins; Lambda is untouched. The variable is
    put back afterwards (a test calling the command line in-process leaves nothing behind)."""
    key, before = "POWERTOOLS_LOG_LEVEL", os.environ.get("POWERTOOLS_LOG_LEVEL")
    if log_level.upper() != "DEBUG" and before is None:
        os.environ[key] = "WARNING"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


def usage_stats_on(env: Mapping[str, str]) -> bool:
    """Whether Ray's usage stats are on in ``env`` (the job turns them off; an explicit value set before wins)."""
    return env.get("RAY_USAGE_STATS_ENABLED") != "0"


def ray_temp_dir(settings: Settings) -> str:
    """Ray's temp dir, under ICEBATCH_HOME.

    Ray puts unix sockets in it, whose paths may not exceed 107 bytes; a deep ICEBATCH_HOME is reached
    through a short symlink in /tmp so that the files still live under the project's folder.
    """
    real = settings.home / "ray"
    real.mkdir(parents=True, exist_ok=True)
    if len(str(real)) <= 40:
        return str(real)
    link = Path("/tmp") / f"icebatch-ray-{hashlib.sha1(str(real).encode()).hexdigest()[:10]}"
    _remove_dangling_links(Path("/tmp"))
    if not link.is_symlink() or link.resolve() != real:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(real, target_is_directory=True)
    return str(link)


def _remove_dangling_links(folder: Path) -> None:
    """The links of homes that are gone (a removed project, a test's temporary home): nothing else cleans them."""
    for old in folder.glob("icebatch-ray-*"):
        with contextlib.suppress(OSError):  # another job's cleanup may have come first
            if old.is_symlink() and not old.exists():
                old.unlink()


def init_ray(settings: Settings, env: dict[str, str], *, num_cpus: int | None = None) -> None:
    """Connect to the cluster the job runs in (RayJob, `ray-jobs` mode) or start a local one."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {
        # workers' logs stay in Ray's session logs (under ICEBATCH_HOME/ray) unless debugging
        "log_to_driver": settings.top.log_level.upper() == "DEBUG",
        "logging_level": logging.DEBUG if settings.top.log_level.upper() == "DEBUG" else logging.WARNING,
        "ignore_reinit_error": True,
    }
    address = os.environ.get("RAY_ADDRESS") or settings.launch.ray_address
    if address:
        kwargs["address"] = address
        kwargs["runtime_env"] = {"env_vars": env}
    else:
        own_the_tree()
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private, loopback-only cluster
        kwargs.update(
            address="local",  # a new instance: never attach to some other cluster found in /tmp/ray
            _temp_dir=ray_temp_dir(settings),
            include_dashboard=False,
            # Logical CPUs, not cores: the engine's bundle takes one, and Ray Data's budget would leave
            # nothing for the (mostly waiting) read and prompt stages on a 2-core machine: a silent hang.
            num_cpus=num_cpus or max(4, 2 * (os.cpu_count() or 2)),
            _node_ip_address="127.0.0.1",
        )
    log.info("starting Ray (%s)", address or "local, 127.0.0.1")
    quiet = local_head_without_idle_processes(usage_stats=usage_stats_on(env), log_to_driver=kwargs["log_to_driver"])
    with nullcontext() if address else quiet:
        ray.init(**kwargs)
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False  # icebatch prints its own progress
    from ray.util.debug import log_once

    log_once("ray_data_progress_manager_disabled")  # taken: no "Progress bars disabled. To enable, ..." (we did)
    ctx.print_on_execution_start = False
    # Rows for the engine carry vLLM's FINAL_ONLY as a pickled reference (icebatch_job.stages.prompts.FinalOnly),
    # which Arrow cannot hold: say explicitly that such a column is kept as pickled Python objects (Ray's
    # default for compatibility, with a warning, might change)
    ctx.enable_fallback_to_arrow_object_ext_type = True
    logging.getLogger("ray.data").setLevel(logging.WARNING)


_owning: list[bool] = []


def own_the_tree() -> None:
    """Before this process starts a Ray instance: every process of its tree ends with it (once per process).

    Orphans of the tree are handed to this process (a child subreaper) and, at exit, once Ray is shut
    down, whatever is left is killed (``icebatch_job.process.lineage``); a watchdog in a session of its own ends
    what is left if this process is killed without notice (``icebatch_job.process.reaper``: Ray's agents).
    """
    if _owning:
        return
    _owning.append(adopt_orphans())
    if swept := sweep_abandoned_records():
        log.info("unlinked shared memory a killed job left: %s", ", ".join(f"/dev/shm/{n}" for n in swept))
    record = record_shared_memory()
    start_reaper(shared_memory=record)
    atexit.register(_end_the_tree, record)


def _end_the_tree(shared_memory: Path) -> None:
    """At exit: Ray shut down as Ray's own exit handler would (it may come later: it was registered when Ray
    was imported), then what is left of the tree ended, then the shared memory it created and left unlinked
    (``icebatch_job.process.shared_memory``)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    end_descendants()
    if left := unlink_recorded_shared_memory(shared_memory):
        log.info("unlinked shared memory the job's processes left: %s", ", ".join(f"/dev/shm/{n}" for n in left))


def end_process(status: int) -> NoReturn:
    """End the job's process with ``status`` as an ordinary exit does, less the teardown of its objects.

    Once the job has printed its summary, all it owes is durable (results committed, event sent, report
    written), and an ordinary exit would still take seconds a user pays for (a RayJob's pod, its GPU node):
    Ray's exit handler sleeps 0.5 s for workers' logs (which the job does not forward), and the interpreter
    then tears down every module of a heap holding pyarrow, pyiceberg, Ray and Ray Data (~2 s of garbage
    collection on 2 cores). Here Ray is shut down first; then, as at any exit and in its order, the threads
    that are not daemons are waited for and every exit handler runs (logging's, the end of what is left of
    the job's processes: ``own_the_tree``, ...), and the standard streams are flushed; only the objects'
    teardown is skipped.

        if __name__ == "__main__":
            end_process(main())
    """
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()  # a local instance's processes stopped; a cluster's connection closed
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's first step at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a stream closed: nothing more can be said on it
            pass
    os._exit(status)


def _not_started(name: str) -> Any:
    def start(node: Any, **_kwargs: Any) -> None:
        log.debug("local Ray instance: no %s process", name)

    return start


@contextmanager
def local_head_without_idle_processes(*, usage_stats: bool, log_to_driver: bool) -> Iterator[None]:
    """A local Ray instance started without the head processes that would have nothing to do in it.

    Each is a Python interpreter importing Ray while the engine starts, on the same cores:

    - **The autoscaler's monitor**, always: a private instance on one machine has no nodes to add or remove.
      At the end it ignores the SIGTERM of ``ray.shutdown``, which waits its full second before killing
      it. KubeRay's operator starts a head the same way (``no_monitor``), its autoscaler running beside it.
    - **The dashboard process**, unless ``usage_stats`` (the job turns them off): with
      ``include_dashboard=False`` Ray 2.60 still starts it (loading only its usage-stats module) and
      ``ray.init`` waits for it to publish an address before it starts the raylet: ~1.3 s on 2 cores on the
      path to the engine's first token. Nothing else reads it (the state API it would serve is not loaded
      when the dashboard is not included).
    - **The log monitor**, unless ``log_to_driver`` (the job forwards workers' logs only when debugging):
      it forwards them to the driver and nothing else, looking through the log folder ten times a second.
      The logs stay in the session's folder.

    On a cluster the job connects to (a RayJob), Ray's head starts as deployed.
    """
    from ray._private import node

    skipped = ["start_monitor"]
    skipped += [] if usage_stats else ["start_api_server"]
    skipped += [] if log_to_driver else ["start_log_monitor"]
    originals = {name: getattr(node.Node, name, None) for name in skipped}
    if None in originals.values():  # another Ray: its own start-up
        yield
        return
    for name in skipped:
        setattr(node.Node, name, _not_started(name.removeprefix("start_")))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(node.Node, name, original)


class _NoTelemetry:
    """Stands in for Ray LLM's ``TelemetryAgent`` when usage stats are off: records nothing."""

    def push_telemetry_report(self, telemetry: object) -> None:
        log.debug("usage stats off: Ray Data LLM telemetry not recorded")


@contextmanager
def without_usage_telemetry() -> Iterator[None]:
    """With usage stats off, Ray Data LLM's processor build starts no telemetry actor.

    ``build_processor`` starts a detached ``_TelemetryAgent`` actor and waits for it to answer, to record
    usage tags, even with ``RAY_USAGE_STATS_ENABLED=0`` (which the job sets): a Ray worker process booted,
    and a round trip on the driver's path to the first token, for tags that are never sent.
    """
    from ray.llm._internal.batch.processor import vllm_engine_proc

    original = getattr(vllm_engine_proc, "get_or_create_telemetry_agent", None)
    if original is None or usage_stats_on(os.environ):
        yield
        return
    vllm_engine_proc.get_or_create_telemetry_agent = _NoTelemetry  # type: ignore[assignment]
    try:
        yield
    finally:
        vllm_engine_proc.get_or_create_telemetry_agent = original


# CPU features that make bfloat16 matmuls native: x86's in /proc/cpuinfo's "flags", aarch64's in its "Features"
NATIVE_BF16_FEATURES = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this machine's CPU computes in bfloat16 natively (``cpuinfo``: ``/proc/cpuinfo``'s text).

    Without it (an AVX2-only x86 CPU, say) torch emulates bfloat16 matmuls. Where the CPU cannot be read
    (no ``/proc``), the answer is yes: nothing is changed on a guess.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool(NATIVE_BF16_FEATURES & set(value.split()))
    return True


def engine_has_native_bf16(device: str) -> bool:
    """Whether an engine on ``device`` computes in bfloat16 natively: a GPU's dtype is not the host CPU's
    business (yes); on CPU, ``cpu_has_native_bf16`` (the ``native_bf16`` of ``pipeline.engine_config``)."""
    return device != "cpu" or cpu_has_native_bf16()


def detect_device(settings: Settings) -> str:
    """`cpu` or `gpu`: as configured, or what the Ray cluster has when `auto`."""
    if settings.engine.device != "auto":
        return settings.engine.device
    try:
        import ray

        if ray.is_initialized():
            return "gpu" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"
