"""The engine's plan without an engine: what we hand to vLLM and Ray (as Ray's own CPU tests do)."""

from __future__ import annotations

from pathlib import Path

import pytest
from icebatch.core.settings import Settings
from icebatch_job.process.runtime import (
    cpu_has_native_bf16,
    engine_has_native_bf16,
    is_remote_model,
    job_environment,
)
from icebatch_job.stages.model_copy import copy_folder
from icebatch_job.stages.pipeline import engine_config, in_flight_rows, processor_config

pytestmark = pytest.mark.unit


def test_cpu_plan_pins_a_cpu_bundle_and_structured_output() -> None:
    cfg = engine_config(Settings(), "/models/tiny", "cpu")
    assert cfg.engine_kwargs["enforce_eager"] is True
    assert cfg.engine_kwargs["structured_outputs_config"] == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }
    assert "gpu_memory_utilization" not in cfg.engine_kwargs
    proc = processor_config(cfg)
    assert proc.placement_group_config["bundles"] == [{"CPU": 1.0, "GPU": 0.0}]
    assert proc.accelerator_type is None
    assert (proc.chat_template_stage, proc.tokenize_stage, proc.detokenize_stage) == (False, False, False)
    assert proc.should_continue_on_error is True
    # vLLM's stats off on CPU, as vllm.LLM has them: collecting them costs the engine every step
    assert (cfg.engine_kwargs["disable_log_stats"], proc.log_engine_metrics) == (True, False)


def test_gpu_plan_exposes_the_engine_settings() -> None:
    s = Settings(
        max_model_len=4096,
        max_num_batched_tokens=8192,
        enable_prefix_caching=False,
        concurrency=3,
        accelerator_type="L4",
        dtype="bfloat16",
    )
    cfg = engine_config(s, "s3://models/llama-3.1-8b/", "gpu")
    kw = cfg.engine_kwargs
    assert (kw["gpu_memory_utilization"], kw["max_num_batched_tokens"]) == (0.92, 8192)
    assert "load_format" not in kw  # Ray Data LLM downloads an s3:// model to the node's disk first
    assert (kw["enable_prefix_caching"], kw["enforce_eager"], kw["dtype"]) == (False, False, "bfloat16")
    proc = processor_config(cfg)
    # every replica the RayJob's workers hold starts at once: an int would autoscale from one replica
    assert (proc.concurrency, proc.accelerator_type, proc.placement_group_config) == ((3, 3), "L4", None)
    assert proc.get_concurrency() == {"min_size": 3, "max_size": 3}
    assert cfg.model_name == "llama-3.1-8b"


@pytest.mark.parametrize(
    ("device", "setting", "expected"),
    [("gpu", None, True), ("cpu", None, False), ("cpu", True, True), ("gpu", False, False)],
)
def test_engine_metrics_follow_the_device_unless_set(device: str, setting: bool | None, expected: bool) -> None:
    # given ICEBATCH_ENGINE_METRICS unset (the device decides) or set
    settings = Settings(engine_metrics=setting)
    # when the engine is planned
    cfg = engine_config(settings, "/models/tiny", device)
    # then vLLM collects its stats and Ray Data LLM exports them (what jobimage/k8s/podmonitor.yaml scrapes), or neither
    assert (cfg.metrics, cfg.engine_kwargs["disable_log_stats"]) == (expected, not expected)
    assert processor_config(cfg).log_engine_metrics is expected


def test_s3_models_can_be_streamed_with_runai() -> None:
    streamed = engine_config(Settings(model_load_format="runai_streamer"), "s3://models/llama/", "gpu")
    assert streamed.engine_kwargs["load_format"] == "runai_streamer"
    local = engine_config(Settings(model_load_format="runai_streamer"), "/models/llama", "gpu")
    assert "load_format" not in local.engine_kwargs  # streaming applies to object stores only


def test_a_model_copied_to_the_node_is_streamed_from_there_under_its_own_name(tmp_path: Path) -> None:
    # given nvme_streamer, and the copy of s3://models/llama/ on the engine's node (model_copy.engine_model's answer)
    settings = Settings(model_load_format="nvme_streamer")
    copy = copy_folder(tmp_path, "s3://models/llama/")
    # when the engine is planned on the copy
    cfg = engine_config(settings, str(copy), "gpu")
    # then vLLM's run:ai streamer reads it from the node's disk, and results name the model as its prefix does
    assert (cfg.engine_kwargs["load_format"], cfg.model_source, cfg.model_name) == (
        "runai_streamer",
        str(copy),
        "llama",
    )
    # and models not copied are left to the other load formats' ways
    assert "load_format" not in engine_config(Settings(), str(copy), "gpu").engine_kwargs


@pytest.mark.parametrize("source", ["s3://models/..", "s3://models/a/./", "s3://models/\x7f/"])
def test_a_copy_is_a_folder_of_its_own_whatever_the_prefix_ends_with(tmp_path: Path, source: str) -> None:
    copy = copy_folder(tmp_path, source)
    assert copy.name == "model" and copy.parent.parent == tmp_path / "cache" / "models"


def test_job_environment_points_the_model_downloaders_at_the_aws_endpoint() -> None:
    env = job_environment(Settings(aws_region="eu-west-1", aws_endpoint_url="http://127.0.0.1:5000"), device="gpu")
    # boto3 (Ray Data LLM's downloader) reads the S3 variable, the run:ai streamer only the generic one
    assert (env["AWS_DEFAULT_REGION"], env["AWS_ENDPOINT_URL_S3"], env["AWS_ENDPOINT_URL"]) == (
        "eu-west-1",
        "http://127.0.0.1:5000",
        "http://127.0.0.1:5000",
    )
    assert env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] == "0"
    assert not {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"} & set(job_environment(Settings(), device="gpu"))


def test_structured_output_can_be_switched_off() -> None:
    cfg = engine_config(Settings(structured_output=False), "/m", "cpu")
    assert "structured_outputs_config" not in cfg.engine_kwargs


def test_job_environment_keeps_caches_under_home(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = job_environment(Settings(home=tmp_path), device="cpu")
    for key in ("XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME"):
        assert env[key].startswith(str(tmp_path)), key
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "HF_HUB_OFFLINE" not in job_environment(Settings(model_source="meta-llama/Llama-3.1-8B"), device="gpu")


@pytest.mark.parametrize(
    ("source", "remote"), [("/m/tiny", False), ("./m", False), ("s3://b/m", True), ("org/model", True)]
)
def test_remote_model_detection(source: str, remote: bool) -> None:
    assert is_remote_model(source) is remote


@pytest.mark.parametrize(
    ("device", "accelerator", "seqs", "tokens"),
    [("cpu", None, 256, 4096), ("gpu", "L40S", 256, 8192), ("gpu", "H100", 256, 16384)],
)
def test_the_engine_gets_vllms_offline_defaults_not_the_servers(
    device: str, accelerator: str | None, seqs: int, tokens: int
) -> None:
    # the defect: ray.data.llm builds an AsyncLLM, whose defaults are the server's (on CPU 128 sequences and
    # 2048 batched tokens, on an L40S 2048 tokens), while a bare vllm.LLM gets the offline ones
    cfg = engine_config(Settings(accelerator_type=accelerator), "/models/tiny", device)
    assert (cfg.engine_kwargs["max_num_seqs"], cfg.engine_kwargs["max_num_batched_tokens"]) == (seqs, tokens)
    # and enough batches are in flight to keep that many sequences running, with two to spare: a batch keeps
    # its place until its longest answer is done, and the spare batches' rows take the places its done rows left
    assert cfg.batch_size * cfg.max_concurrent_batches >= seqs + 2 * cfg.batch_size


def test_explicit_engine_limits_win_and_size_the_batches_in_flight() -> None:
    s = Settings(max_num_seqs=1024, max_num_batched_tokens=2048, batch_size=64, chunk_rows=5000)
    cfg = engine_config(s, "/models/tiny", "gpu")
    assert (cfg.engine_kwargs["max_num_seqs"], cfg.engine_kwargs["max_num_batched_tokens"]) == (1024, 2048)
    assert cfg.max_concurrent_batches == 16 + 2
    assert processor_config(cfg).max_concurrent_batches == 16 + 2
    assert in_flight_rows(s) == 64 * (16 + 2 + 3)  # what the row window must leave room for


def test_tensor_parallelism_reaches_the_engine_and_ray_places_its_gpus() -> None:
    cfg = engine_config(Settings(tensor_parallel_size=2), "s3://models/llama/", "gpu")
    assert cfg.engine_kwargs["tensor_parallel_size"] == 2
    assert processor_config(cfg).placement_group_config is None  # Ray Data LLM: tp GPU bundles per replica
    assert "tensor_parallel_size" not in engine_config(Settings(), "s3://models/llama/", "gpu").engine_kwargs


def test_more_replicas_grow_the_chunk_instead_of_failing_the_run() -> None:
    # the defect: at the defaults two replicas kept 704 rows in flight, and the 1,000-row chunk failed every
    # run at start (ConfigError) -- the launcher gives a large backlog up to the consumer's max_gpus (4)
    from icebatch_job.commit.window import chunk_size, commit_every

    four = Settings(concurrency=4)
    in_flight = in_flight_rows(four)
    assert in_flight == 64 * (6 * 4 + 3)
    chunk = chunk_size(four.progress.chunk_rows, in_flight)
    assert chunk == 2 * in_flight and commit_every(chunk, in_flight) == in_flight
    assert chunk_size(1200, in_flight_rows(Settings())) == 1200  # one replica: the default as it is


AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma f16c\n"
AVX512_BF16 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
ARM_PLAIN = "processor\t: 0\nFeatures\t: fp asimd crc32\n"


@pytest.mark.parametrize(
    ("cpuinfo", "native"), [(AVX2_ONLY, False), (AVX512_BF16, True), (ARM_BF16, True), (ARM_PLAIN, False), ("", True)]
)
def test_native_bfloat16_is_read_from_the_cpus_features(cpuinfo: str, native: bool) -> None:
    # an unreadable or featureless cpuinfo changes nothing (no guess)
    assert cpu_has_native_bf16(cpuinfo) is native


def test_only_a_cpu_engine_asks_the_hosts_cpu_about_bfloat16() -> None:
    # given this host's CPU, whatever it is
    # then a GPU engine is taken as native and a CPU engine gets what the host's flags say
    assert engine_has_native_bf16("gpu") is True
    assert engine_has_native_bf16("cpu") is cpu_has_native_bf16()


@pytest.mark.parametrize(
    ("dtype", "device", "native_bf16", "expected"),
    [
        ("auto", "cpu", False, "float32"),  # bfloat16 emulated: the tiny model ran at half float32's tok/s
        ("auto", "cpu", True, "auto"),  # the model's own (bfloat16) where the CPU has it
        ("bfloat16", "cpu", False, "bfloat16"),  # an explicit dtype is the operator's
        ("auto", "gpu", False, "auto"),  # a GPU's dtype is not the host CPU's business
    ],
)
def test_auto_dtype_is_float32_on_a_cpu_without_native_bfloat16(
    dtype: str, device: str, native_bf16: bool, expected: str
) -> None:
    # given ICEBATCH_DTYPE and the engine's device and CPU
    # when the engine is planned (the bare benchmark script plans it the same way)
    cfg = engine_config(Settings(dtype=dtype), "/models/tiny", device, native_bf16=native_bf16)
    # then vLLM gets float32 only where it would otherwise emulate bfloat16
    assert cfg.engine_kwargs["dtype"] == expected
