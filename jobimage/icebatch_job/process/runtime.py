"""The job's process environment: caches under ICEBATCH_HOME, offline model loading, Ray start-up.

vLLM, torch, inductor, Hugging Face and Ray write to ``~/.cache``, ``~/.ray`` and ``/tmp`` unless told
otherwise. ``prepare_environment`` points all of them under ``$ICEBATCH_HOME/cache`` (and Ray's temp dir
under ``$ICEBATCH_HOME/ray``) before any of those libraries is imported, and returns the same variables
for Ray's ``runtime_env`` so that workers see them too.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from icebatch.core.settings import Settings

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
        # boto3 reads the S3 one; the streamer (runai-model-streamer 0.17) only AWS_ENDPOINT_URL, which boto3 also
        # reads for every other service: the endpoint every client of the job is pointed at anyway
        env["AWS_ENDPOINT_URL_S3"] = env["AWS_ENDPOINT_URL"] = settings.aws.aws_endpoint_url
        env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.engine.kv_cache_gib:g}"
    return env


def prepare_environment(settings: Settings, *, device: str = "cpu", model: str | None = None) -> dict[str, str]:
    """Export the job environment into this process (explicit values already set win), with the logging
    configuration through which vLLM tells the job what its start-up spent (``process.engine_start``)."""
    from icebatch_job.process.engine_start import logging_environment

    debug = settings.top.log_level.upper() == "DEBUG"
    env = job_environment(settings, device=device, model=model) | logging_environment(settings.home, debug=debug)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    (settings.home / "cache").mkdir(parents=True, exist_ok=True)
    return {k: os.environ[k] for k in env}


def init_ray(settings: Settings, env: dict[str, str], *, num_cpus: int | None = None) -> None:
    """Connect to the cluster the job runs in (RayJob, `ray-jobs` mode) or start a local one
    (``icebatch_job.local.ray_instance``)."""
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
        log.info("connecting to Ray at %s", address)
        ray.init(address=address, runtime_env={"env_vars": env}, **kwargs)
    else:  # no cluster: one of the job's own, on this machine (what only a laptop or CI needs)
        from icebatch_job.local.ray_instance import start_local_ray

        start_local_ray(settings, num_cpus=num_cpus, **kwargs)
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
