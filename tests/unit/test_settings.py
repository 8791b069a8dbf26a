from __future__ import annotations

from pathlib import Path

import pytest
from icebatch.errors import ConfigError
from icebatch.settings import Settings

pytestmark = pytest.mark.unit


def test_defaults_are_the_embedded_setup() -> None:
    s = Settings.from_env({})
    assert (s.catalog_type, s.source_table, s.consumer, s.backend) == (
        "sql",
        "support.tickets",
        "triage",
        "local",
    )
    assert s.results_table == "support.tickets_triage_results"
    props = s.catalog_props()
    assert props["uri"] == f"sqlite:///{Path('.icebatch').resolve() / 'catalog.db'}"
    assert props["warehouse"].startswith("file://")


def test_environment_values_are_typed_and_validated() -> None:
    s = Settings.from_env(
        {
            "ICEBATCH_HOME": "/tmp/x",
            "ICEBATCH_BACKLOG_THRESHOLD": "500",
            "ICEBATCH_GPU_INSTANCE_TYPES": '["g6.xlarge"]',
            "ICEBATCH_RESULTS_TABLE": "out.verdicts",
            "ICEBATCH_ENABLE_PREFIX_CACHING": "false",
        }
    )
    assert (s.backlog_threshold, s.gpu_instance_types, s.results_table) == (
        500,
        ["g6.xlarge"],
        "out.verdicts",
    )
    assert s.enable_prefix_caching is False


def test_control_plane_catalog_never_needs_pyarrow() -> None:
    assert Settings().catalog_props(control_plane=True)["py-io-impl"] == "icebatch.metadata_io.MetadataFileIO"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ICEBATCH_BACKLOG_THRESHOLD": "lots"}, "ICEBATCH_BACKLOG_THRESHOLD"),
        (
            {"ICEBATCH_BACKLOG_THRESHOLD": "0"},
            "ICEBATCH_BACKLOG_THRESHOLD: Input should be greater than or equal to 1",
        ),
        ({"ICEBATCH_SOURCE_TABLE": "tickets"}, "ICEBATCH_SOURCE_TABLE: .*namespace.table"),
        ({"ICEBATCH_CONSUMER": "Triage_Team"}, "ICEBATCH_CONSUMER: .*lower case"),
        ({"ICEBATCH_BACKEND": "kuberay"}, "ICEBATCH_EKS_CLUSTER"),
        ({"ICEBATCH_ENGINE_MODE": "endpoint"}, "ICEBATCH_ENDPOINT_URL"),
        ({"ICEBATCH_GPU_INSTANCE_TYPES": "g6.xlarge"}, "ICEBATCH_GPU_INSTANCE_TYPES must be JSON"),
        ({"ICEBATCH_THRESHOLD": "5"}, "unknown setting.*ICEBATCH_THRESHOLD"),
    ],
)
def test_bad_configuration_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(Exception, match="frozen"):
        s.consumer = "other"  # type: ignore[misc]
    assert s.with_overrides(consumer="other").consumer == "other"
