from __future__ import annotations

from pathlib import Path

import pytest
from icebatch.core.errors import ConfigError
from icebatch.core.settings import JOB_SECTIONS, SECTIONS, Settings

pytestmark = pytest.mark.unit


def test_defaults_are_the_embedded_setup() -> None:
    s = Settings.from_env({})
    assert (s.catalog.catalog_type, s.catalog.source_table, s.top.backend, s.top.deployment) == (
        "sql",
        "support.tickets",
        "local",
        "local",
    )
    props = s.catalog_props()
    assert props["uri"] == f"sqlite:///{Path('.icebatch').resolve() / 'catalog.db'}"
    assert props["warehouse"].startswith("file://")


def test_environment_values_are_typed_and_validated_by_section() -> None:
    s = Settings.from_env(
        {
            "ICEBATCH_HOME": "/tmp/x",
            "ICEBATCH_MAX_ATTEMPTS": "5",
            "ICEBATCH_GPU_INSTANCE_TYPES": '["g6.xlarge"]',
            "ICEBATCH_ENABLE_PREFIX_CACHING": "false",
            "ICEBATCH_AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
        }
    )
    assert (s.launch.max_attempts, s.cluster.gpu_instance_types, s.home) == (5, ["g6.xlarge"], Path("/tmp/x"))
    assert s.engine.enable_prefix_caching is False and s.aws.aws_endpoint_url == "http://127.0.0.1:5000"


def test_what_the_launcher_writes_for_a_job_reads_back_the_same() -> None:
    # given settings with every kind of value changed from its default (floats in exponent form included)
    s = Settings().with_overrides(
        kv_cache_gib=1e-05,
        gpu_hourly_rate=999.5,
        chunk_seconds=0.5,
        enforce_eager=False,
        structured_output=False,
        batch_size=7,
        max_model_len=4096,
    )
    # when they travel as a job's environment variables (a RayJob's pod), then they read back equal
    back = Settings.from_env(s.job_environment())
    assert [getattr(back, name) for name in JOB_SECTIONS] == [getattr(s, name) for name in JOB_SECTIONS]


def test_lambdas_region_becomes_the_settings_region() -> None:
    assert Settings.from_env({"AWS_REGION": "eu-west-1"}).aws.aws_region == "eu-west-1"
    assert (
        Settings.from_env({"AWS_REGION": "eu-west-1", "ICEBATCH_AWS_REGION": "us-east-2"}).aws.aws_region == "us-east-2"
    )


def test_control_plane_catalog_never_needs_pyarrow() -> None:
    assert Settings().catalog_props(control_plane=True)["py-io-impl"] == "icebatch.core.metadata_io.MetadataFileIO"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ICEBATCH_MAX_ATTEMPTS": "lots"}, "ICEBATCH_MAX_ATTEMPTS"),
        ({"ICEBATCH_MAX_ATTEMPTS": "0"}, "ICEBATCH_MAX_ATTEMPTS: Input should be greater than or equal to 1"),
        ({"ICEBATCH_SOURCE_TABLE": "tickets"}, "ICEBATCH_SOURCE_TABLE: .*namespace.table"),
        ({"ICEBATCH_DEPLOYMENT": "prod/x"}, "ICEBATCH_DEPLOYMENT: .*letters, digits"),
        ({"ICEBATCH_ENGINE_MODE": "endpoint"}, "ICEBATCH_ENDPOINT_URL"),
        ({"ICEBATCH_GPU_INSTANCE_TYPES": "g6.xlarge"}, "ICEBATCH_GPU_INSTANCE_TYPES must be JSON"),
        ({"ICEBATCH_THRESHOLD": "5"}, "unknown setting.*ICEBATCH_THRESHOLD"),
        ({"ICEBATCH_CONSUMER": "triage"}, "unknown setting.*ICEBATCH_CONSUMER"),  # consumers live in their file
        ({"ICEBATCH_DRY_RUN": "maybe"}, "ICEBATCH_DRY_RUN"),
        ({"ICEBATCH_LOG_LEVEL": "LOUD"}, "ICEBATCH_LOG_LEVEL"),
        ({"ICEBATCH_BATCH_API_PRICES": "gpt=cheap"}, "ICEBATCH_BATCH_API_PRICES: .*provider:model="),
        ({"ICEBATCH_DTYPE": "fp32"}, "ICEBATCH_DTYPE: .*'auto', 'bfloat16', 'float16', 'half', 'float32' or 'float'"),
        # a variable's text is exactly its value: no lenient coercion
        ({"ICEBATCH_DRY_RUN": "yes"}, "ICEBATCH_DRY_RUN: .*'yes' is not `true` or `false`"),
        ({"ICEBATCH_STRUCTURED_OUTPUT": "1"}, "ICEBATCH_STRUCTURED_OUTPUT: .*'1' is not `true` or `false`"),
        ({"ICEBATCH_K8S_VERIFY_SSL": "True"}, "ICEBATCH_K8S_VERIFY_SSL: .*'True' is not `true` or `false`"),
        ({"ICEBATCH_ENFORCE_EAGER": "on"}, "ICEBATCH_ENFORCE_EAGER: .*'on' is not `true` or `false`"),
        ({"ICEBATCH_MAX_MODEL_LEN": "2_048"}, "ICEBATCH_MAX_MODEL_LEN: .*'2_048' is not a whole number"),
        ({"ICEBATCH_BATCH_SIZE": " 64"}, "ICEBATCH_BATCH_SIZE: .*' 64' is not a whole number"),
        ({"ICEBATCH_CHUNK_ROWS": "1e3"}, "ICEBATCH_CHUNK_ROWS: .*'1e3' is not a whole number"),
        ({"ICEBATCH_MAX_ATTEMPTS": "+3"}, "ICEBATCH_MAX_ATTEMPTS: .*'\\+3' is not a whole number"),
        # finite and bounded: an `inf` rate made every cost report of a finished run unbuildable
        ({"ICEBATCH_GPU_HOURLY_RATE": "inf"}, "ICEBATCH_GPU_HOURLY_RATE: .*'inf' is not a finite decimal number"),
        ({"ICEBATCH_KV_CACHE_GIB": "1e400"}, "ICEBATCH_KV_CACHE_GIB: .*'1e400' is not a finite decimal number"),
        ({"ICEBATCH_CHUNK_SECONDS": "nan"}, "ICEBATCH_CHUNK_SECONDS: .*'nan' is not a finite decimal number"),
        ({"ICEBATCH_BATCH_SIZE": "99999999999"}, "ICEBATCH_BATCH_SIZE: Input should be less than or equal to 65536"),
        ({"ICEBATCH_ENDPOINT_CONCURRENCY": "100000"}, "ICEBATCH_ENDPOINT_CONCURRENCY: Input should be less than"),
    ],
)
def test_bad_configuration_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_settings_are_frozen_and_overrides_are_validated() -> None:
    s = Settings()
    with pytest.raises(Exception, match="frozen"):
        s.engine.batch_size = 1  # type: ignore[misc]
    assert s.with_overrides(batch_size=8).engine.batch_size == 8
    with pytest.raises(ConfigError, match="ICEBATCH_BATCH_SIZE"):
        s.with_overrides(batch_size=0)


def test_every_variable_names_one_setting_in_one_section() -> None:
    seen: dict[str, str] = {}
    for name, section in SECTIONS.items():
        for field in section.model_fields:
            assert field not in seen, f"{field} is in {seen.get(field)} and {name}"
            seen[field] = name
    assert set(JOB_SECTIONS) <= set(SECTIONS)


def test_a_worker_shared_memory_that_leaves_the_engine_no_room_is_a_config_error() -> None:
    # given a worker whose memory-backed /dev/shm (counted in its memory limit) leaves under 6 GiB beside it
    with pytest.raises(ConfigError, match="ICEBATCH_WORKER_SHM") as refused:
        Settings.from_env({"ICEBATCH_WORKER_MEMORY": "12Gi", "ICEBATCH_WORKER_SHM": "8Gi"})
    # then the settings are refused with what to change, not a pod OOM-killed while it loads the model
    assert "raise ICEBATCH_WORKER_MEMORY or lower ICEBATCH_WORKER_SHM" in str(refused.value)
    roomy = Settings.from_env({"ICEBATCH_WORKER_MEMORY": "12Gi", "ICEBATCH_WORKER_SHM": "6Gi"})
    assert roomy.cluster.worker_shm == "6Gi"
    with pytest.raises(ConfigError, match="ICEBATCH_WORKER_SHM"):
        Settings.from_env({"ICEBATCH_WORKER_SHM": "2 GB"})
