"""The streaming pipeline: incremental read -> prompts -> LLM -> validated result rows.

Two interchangeable middles, chosen by ``ICEBATCH_ENGINE_MODE``:

- ``engine`` (default): ``ray.data.llm.build_processor(vLLMEngineProcessorConfig(...))`` with vLLM in
  the job's Ray actors; GPU when the cluster has one, vLLM's CPU build otherwise.
- ``endpoint``: the same rows are sent to an existing OpenAI-compatible server (``icebatch_job.stages.endpoint``).

Either way the first stage takes the row window's permits (``icebatch_job.commit.window``) and the driver turns
each engine output into exactly one result row with an explicit status (``icebatch_job.stages.parse``); nothing
is dropped.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icebatch.core.settings import Settings
from icebatch.core.task import TaskSpec

from icebatch_job.columns import PARSED_FIELDS, SMALL_CPU
from icebatch_job.process.amx import EXTENSION as AMX_EXTENSION
from icebatch_job.process.runtime import is_remote_model
from icebatch_job.stages.inputs import RunSource
from icebatch_job.stages.parse import ResultParser
from icebatch_job.stages.prompts import PromptStage

if TYPE_CHECKING:
    import ray.data

    from icebatch_job.commit.window import RowWindow

log = logging.getLogger(__name__)

PROMPT_STAGE_MEMORY = 512 * 1024**2  # a tokenizer and its batch (measured ~310 MiB with the tiny model)
MIN_CONCURRENT_BATCHES = 4  # batches each engine replica works on at once (ray.data.llm's max_concurrent_batches)
# beyond those that fill max_num_seqs: a batch holds its place until its last row is done, so without spare
# batches the engine runs below max_num_seqs while each batch's longest answers finish (Ray Data LLM's
# semaphore keeps at most 1.1x max_num_seqs of their rows in the engine, the rest wait in the actor)
SPARE_BATCHES = 2


LARGE_GPUS = ("H100", "H200", "B200", "B300", "GB200")  # >= 70 GB: vLLM's larger offline defaults


def offline_max_num_seqs(device: str, tp: int) -> int:
    """vLLM's ``max_num_seqs`` for ``vllm.LLM`` (UsageContext.LLM_CLASS)."""
    return 256 * tp if device == "cpu" else 256


def offline_max_num_batched_tokens(device: str, tp: int, accelerator_type: str | None) -> int:
    """vLLM's ``max_num_batched_tokens`` for ``vllm.LLM`` (UsageContext.LLM_CLASS)."""
    if device == "cpu":
        return 4096 * tp
    return 16384 if (accelerator_type or "").upper() in LARGE_GPUS else 8192


@dataclass(frozen=True)
class EngineConfig:
    """What the engine stage is built from (also recorded in the run's report)."""

    model_source: str
    model_name: str
    device: str
    engine_kwargs: dict[str, Any]
    batch_size: int
    concurrency: int
    accelerator_type: str | None
    max_concurrent_batches: int = MIN_CONCURRENT_BATCHES
    metrics: bool = False  # vLLM's stats, exported to Ray's Prometheus endpoint (``disable_log_stats`` says the same)


def concurrent_batches(batch_size: int, max_num_seqs: int) -> int:
    """Batches in flight per replica: enough to keep ``max_num_seqs`` sequences running, and ``SPARE_BATCHES``."""
    return max(MIN_CONCURRENT_BATCHES, math.ceil(max_num_seqs / batch_size) + SPARE_BATCHES)


def engine_dtype(dtype: str, device: str, *, native_bf16: bool) -> str:
    """The dtype vLLM gets: the setting, except that ``auto`` (the model's own, bfloat16 for most models) is
    float32 on a CPU without native bfloat16 (``runtime.cpu_has_native_bf16``), where torch emulates bfloat16's
    matmuls: the tiny model generated 2.0x the output tokens per second in float32 on an AVX2-only CPU."""
    return "float32" if dtype == "auto" and device == "cpu" and not native_bf16 else dtype


def engine_config(settings: Settings, model_source: str, device: str, *, native_bf16: bool = True) -> EngineConfig:
    """vLLM engine arguments from the settings (pure; see tests/unit/test_engine_plan.py).

    ``native_bf16``: whether the engine's CPU computes in bfloat16 natively (``runtime.cpu_has_native_bf16``;
    it matters only on CPU, see ``engine_dtype``).
    """
    kwargs: dict[str, Any] = {
        "max_model_len": settings.engine.max_model_len,
        "dtype": engine_dtype(settings.engine.dtype, device, native_bf16=native_bf16),
        "enable_prefix_caching": settings.engine.enable_prefix_caching,
        "enable_chunked_prefill": settings.engine.enable_chunked_prefill,
        "enforce_eager": settings.engine.enforce_eager
        if settings.engine.enforce_eager is not None
        else device == "cpu",
        # the model worker asks for AMX tiles before vLLM's CPU attention uses them (SIGILL otherwise)
        "worker_extension_cls": AMX_EXTENSION,
    }
    if settings.engine.structured_output:
        # guidance keeps strings free of raw control characters (xgrammar let ~15 % through on CPU)
        kwargs["structured_outputs_config"] = {"backend": "guidance", "disable_any_whitespace": True}
    tp = settings.engine.tensor_parallel_size
    if tp > 1:
        kwargs["tensor_parallel_size"] = tp  # Ray Data LLM places the replica's tp GPUs in one placement group
    # A batch job is vLLM's offline workload: the defaults vllm.LLM gets, not those of the server (AsyncLLM,
    # which ray.data.llm constructs): on CPU 256 sequences / 4096 tokens instead of 128 / 2048, on a GPU
    # 8192 batched tokens instead of 2048 (vllm.engine.arg_utils, UsageContext.LLM_CLASS).
    kwargs["max_num_seqs"] = settings.engine.max_num_seqs or offline_max_num_seqs(device, tp)
    kwargs["max_num_batched_tokens"] = settings.engine.max_num_batched_tokens or offline_max_num_batched_tokens(
        device, tp, settings.engine.accelerator_type
    )
    metrics = settings.engine.engine_metrics if settings.engine.engine_metrics is not None else device == "gpu"
    kwargs["disable_log_stats"] = not metrics  # vLLM's stats cost the engine core and front end CPU every step
    if device == "gpu":
        kwargs["gpu_memory_utilization"] = settings.engine.gpu_memory_utilization
    load_format = settings.engine.model_load_format
    if model_source.startswith("s3://") and load_format == "runai_streamer":
        kwargs["load_format"] = "runai_streamer"  # else Ray Data LLM downloads it to the node's disk first
    if load_format == "nvme_streamer" and not is_remote_model(model_source):
        kwargs["load_format"] = "runai_streamer"  # the copy on the node's disk (``model_copy``), streamed from there
    if load_format == "dummy":
        kwargs["load_format"] = "dummy"  # random weights: the architecture's cost without its checkpoint
    return EngineConfig(
        model_source=model_source,
        model_name=model_source.rstrip("/").rsplit("/", 1)[-1],
        device=device,
        engine_kwargs=kwargs,
        batch_size=settings.engine.batch_size,
        concurrency=settings.engine.concurrency,
        accelerator_type=settings.engine.accelerator_type if device == "gpu" else None,
        max_concurrent_batches=concurrent_batches(settings.engine.batch_size, kwargs["max_num_seqs"]),
        metrics=metrics,
    )


def processor_config(cfg: EngineConfig) -> Any:
    """The ray.data.llm processor config: our prompt stage does the work of Ray's template/tokenize stages."""
    from ray.data.llm import vLLMEngineProcessorConfig

    extra: dict[str, Any] = {}
    if cfg.device == "cpu":
        # without an explicit CPU bundle the vLLM stage asks for a GPU and waits forever
        extra["placement_group_config"] = {"bundles": [{"CPU": 1}]}
    return vLLMEngineProcessorConfig(
        model_source=cfg.model_source,
        engine_kwargs=cfg.engine_kwargs,
        batch_size=cfg.batch_size,
        # (n, n), not n: an int makes Ray Data LLM autoscale from ONE replica up to n, while the RayJob's
        # worker group holds (and bills) n GPU workers from the start
        concurrency=(cfg.concurrency, cfg.concurrency),
        accelerator_type=cfg.accelerator_type,
        chat_template_stage=False,
        tokenize_stage=False,
        detokenize_stage=False,  # vLLM's front end decodes the answers as it generates them
        should_continue_on_error=True,  # a failed row becomes an inference_error row, not a failed job
        log_engine_metrics=cfg.metrics,  # vLLM's metrics on Ray's Prometheus endpoint (jobimage/k8s/podmonitor.yaml)
        max_concurrent_batches=cfg.max_concurrent_batches,
        **extra,
    )


def parsed_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The processor's postprocess: only what the driver's parse reads goes on through the object store.

    Ray Data LLM's vLLM stage adds to each row the prompt, its token ids, the answer's token ids and the
    sampling parameters (the whole JSON schema, per row); a row that failed (``__inference_error__``) skips
    the postprocess and keeps them all (Ray Data LLM's rule), and the parse reads the same fields of it.
    """
    return {f: row[f] for f in PARSED_FIELDS if f in row}


def build_engine_pipeline(
    sources: list[RunSource],
    cfg: EngineConfig,
    *,
    model_path: str,
    max_model_len: int,
    structured_output: bool,
) -> ray.data.Dataset:
    """source rows -> engine outputs through vLLM in this Ray cluster (``ray.data.llm``'s documented API).

    Our prompt stage (permits, prompts, token ids) feeds the processor that ``build_processor`` makes of
    the config (its chat-template and tokenize stages off: the prompt stage did their work), whose postprocess
    keeps the fields the parse reads. Several sources (a shared job's runs) each have a prompt stage of their own
    (their tables' columns differ; their prompts do not): ``Dataset.union`` joins them before the one processor.
    """
    import ray.data
    from ray.data.llm import build_processor

    # the processor's row maps (a dict per row, microseconds): a small CPU each (on 2 cores a whole CPU each starves
    # the engine), and a task at a time per replica: each task Ray runs at once is a worker process to start (Ray,
    # Ray Data, pyarrow: ~0.3 GB, seconds of CPU), and a budget of small CPUs started ten while the engine started
    light = {"num_cpus": SMALL_CPU, "compute": ray.data.TaskPoolStrategy(size=cfg.concurrency)}
    processor = build_processor(
        processor_config(cfg),
        postprocess=parsed_fields,
        preprocess_map_kwargs=light,
        postprocess_map_kwargs=light,
    )
    prompts = [
        source.dataset.map_batches(
            PromptStage,
            fn_constructor_kwargs={
                "task": source.task,
                "model_path": model_path,
                "max_model_len": max_model_len,
                "structured_output": structured_output,
                "window": source.window,
                "engine": True,
                "member": source.member,
            },
            batch_size=None,  # one block (``blocks_of``: at most one engine batch) per call, one permit request
            compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=SMALL_CPU,
            memory=PROMPT_STAGE_MEMORY,
            # not restarted: Ray Data keeps its constructor arguments in the object store, so a restart may fail
            # anyway, and Ray says so at ERROR level on every run (ray-project/ray#53727); a prompt stage that dies
            # fails the attempt, whose next one resumes after the committed chunks
            max_restarts=0,
        )
        for source in sources
    ]
    return processor(prompts[0].union(*prompts[1:]) if len(prompts) > 1 else prompts[0])


@dataclass(frozen=True)
class BuiltPipeline:
    """Engine outputs (``dataset``) and what turns each batch of them into result rows (``parse``)."""

    dataset: ray.data.Dataset
    parse: ResultParser
    model_name: str


def in_flight_rows(settings: Settings) -> int:
    """Rows the pipeline needs between the read and the job to keep the engine busy (``icebatch_job.commit.window``).

    In-job engine: each replica's concurrent batches, plus the prompt stage's batch, the one the engine
    stage is filling and one on its way to the driver. Endpoint: the batch being answered and the one
    queued behind it, plus one on its way to the driver.
    """
    e = settings.engine
    if e.engine_mode == "endpoint":
        from icebatch_job.stages.endpoint import endpoint_batch_size

        return 2 * endpoint_batch_size(settings) + e.batch_size
    seqs = e.max_num_seqs or offline_max_num_seqs(e.device if e.device != "auto" else "gpu", e.tensor_parallel_size)
    return e.batch_size * (concurrent_batches(e.batch_size, seqs) * e.concurrency + 3)


def build_pipeline(
    source: ray.data.Dataset,
    task: TaskSpec,
    settings: Settings,
    *,
    window: RowWindow | None,
    run_id: str,
    model: str,
    device: str,
) -> BuiltPipeline:
    """Source rows -> engine outputs, through the in-job engine or an existing endpoint (a setting)."""
    if settings.engine.engine_mode == "endpoint":
        from icebatch_job.stages.endpoint import build_endpoint_pipeline

        name = settings.engine.endpoint_model or "endpoint"
        dataset = build_endpoint_pipeline([RunSource(source, task, window)], settings)
        return BuiltPipeline(dataset, ResultParser(task, run_id, name), name)
    cfg = engine_for(settings, model, device)
    dataset = build_engine_pipeline(
        [RunSource(source, task, window)],
        cfg,
        model_path=model,
        max_model_len=settings.engine.max_model_len,
        structured_output=settings.engine.structured_output,
    )
    return BuiltPipeline(dataset, ResultParser(task, run_id, cfg.model_name), cfg.model_name)


def build_shared_pipeline(
    sources: list[RunSource], settings: Settings, *, model: str, device: str
) -> tuple[ray.data.Dataset, str]:
    """Several runs' rows -> engine outputs through one engine, or one endpoint (``icebatch_job.shared``); each output
    row names its run (``columns.MEMBER``). Returns the dataset and the model's name."""
    if settings.engine.engine_mode == "endpoint":
        from icebatch_job.stages.endpoint import build_endpoint_pipeline

        return build_endpoint_pipeline(sources, settings), settings.engine.endpoint_model or "endpoint"
    cfg = engine_for(settings, model, device)
    dataset = build_engine_pipeline(
        sources,
        cfg,
        model_path=model,
        max_model_len=settings.engine.max_model_len,
        structured_output=settings.engine.structured_output,
    )
    return dataset, cfg.model_name


def engine_for(settings: Settings, model: str, device: str) -> EngineConfig:
    """The engine's configuration on this node (the CPU's bfloat16 support read here), with the model where the engine
    loads it from (``model_copy.engine_model``: with ``nvme_streamer``, its copy on the engine's nodes)."""
    from icebatch_job.process.runtime import engine_has_native_bf16
    from icebatch_job.stages.model_copy import engine_model

    loaded = engine_model(settings, model, device)
    cfg = engine_config(settings, loaded, device, native_bf16=engine_has_native_bf16(device))
    if cfg.engine_kwargs["dtype"] != settings.engine.dtype:
        log.info(
            "engine in %s: this CPU has no native bfloat16 (ICEBATCH_DTYPE=%s; set ICEBATCH_DTYPE=bfloat16 to "
            "keep the model's)",
            cfg.engine_kwargs["dtype"],
            settings.engine.dtype,
        )
    return cfg
