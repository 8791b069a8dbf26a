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
