"""The engine's plan without an engine: what we hand to vLLM and Ray (as Ray's own CPU tests do)."""

from __future__ import annotations

import pytest
from icebatch.core.settings import Settings
from icebatch_job.model import is_remote_model
from icebatch_job.pipeline import engine_config, processor_config
from icebatch_job.runtime import job_environment

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
    assert proc.log_engine_metrics is True  # what jobimage/k8s/podmonitor.yaml scrapes


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
    assert (proc.concurrency, proc.accelerator_type, proc.placement_group_config) == (3, "L4", None)
    assert cfg.model_name == "llama-3.1-8b"


def test_s3_models_can_be_streamed_with_runai() -> None:
    streamed = engine_config(Settings(model_load_format="runai_streamer"), "s3://models/llama/", "gpu")
    assert streamed.engine_kwargs["load_format"] == "runai_streamer"
    local = engine_config(Settings(model_load_format="runai_streamer"), "/models/llama", "gpu")
    assert "load_format" not in local.engine_kwargs  # streaming applies to object stores only


def test_job_environment_points_the_model_downloaders_at_the_aws_endpoint() -> None:
    env = job_environment(Settings(aws_region="eu-west-1", aws_endpoint_url="http://127.0.0.1:5000"), device="gpu")
    assert (env["AWS_DEFAULT_REGION"], env["AWS_ENDPOINT_URL_S3"], env["RUNAI_STREAMER_S3_ENDPOINT"]) == (
        "eu-west-1",
        "http://127.0.0.1:5000",
        "http://127.0.0.1:5000",
    )
    assert "AWS_ENDPOINT_URL_S3" not in job_environment(Settings(), device="gpu")


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
