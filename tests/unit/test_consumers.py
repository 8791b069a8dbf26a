"""The consumers file: what a deployment declares, validated, with errors naming the file and entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from icebatch.core.consumers import DEFAULT_CONSUMERS_FILE, Consumer, consumer_named, load_consumers
from icebatch.core.errors import ConfigError
from icebatch.core.settings import Settings

pytestmark = pytest.mark.unit


def write(tmp_path: Path, body: str) -> Settings:
    (tmp_path / "tasks").mkdir(exist_ok=True)
    (tmp_path / "tasks" / "triage.json").write_text(
        (DEFAULT_CONSUMERS_FILE.parent / "tasks" / "triage.json").read_text()
    )
    (tmp_path / "consumers.yaml").write_text(body)
    return Settings(consumers_file=tmp_path / "consumers.yaml")


def test_the_default_file_declares_two_different_tasks_on_the_tickets() -> None:
    consumers = load_consumers(Settings())
    assert [c.name for c in consumers] == ["triage", "privacy"]
    triage, privacy = consumers
    assert triage.results_table == "support.tickets_triage_results"
    assert privacy.results_table == "support.tickets_privacy_results"
    assert set(triage.task.output_fields) != set(privacy.task.output_fields)
    assert triage.budget is not None and triage.budget.max_usd_per_run == 25.0


def test_a_job_reads_its_one_consumer_from_the_launcher_not_from_a_file(tmp_path: Path) -> None:
    triage = load_consumers(Settings())[0]
    s = Settings(consumers_file=tmp_path / "absent.yaml", job_consumer=triage.to_json())
    assert load_consumers(s) == [triage]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("consumers: []", "1 to 50 entries"),
        ("consumers: [{name: Triage, task: tasks/triage.json}]", "entry 1: name: .*lower case"),
        ("consumers: [{name: a, task: tasks/missing.json}]", "entry 1: task file .* does not exist"),
        ("consumers: [{name: a, task: tasks/triage.json, backlog_threshold: '100'}]", "entry 1: backlog_threshold"),
        ("consumers: [{name: a, task: tasks/triage.json, treshold: 5}]", "entry 1: treshold: Extra inputs"),
        ("consumers: [{name: a, task: tasks/triage.json}, {name: a, task: tasks/triage.json}]", "share the name 'a'"),
        ("consumers: [{name: a, task: tasks/triage.json, results_table: support.tickets}]", "cannot be the source"),
        ("consumers: [{name: a, task: tasks/triage.json, budget: {max_usd_per_run: -1}}]", "greater than 0"),
        ("consumers: {", "is not YAML"),
    ],
)
def test_a_bad_consumers_file_is_one_clear_error(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_consumers(write(tmp_path, body))


def test_naming_a_consumer() -> None:
    consumers = load_consumers(Settings())
    assert consumer_named(consumers, "privacy").name == "privacy"
    with pytest.raises(ConfigError, match="name one with --consumer"):
        consumer_named(consumers, None)
    with pytest.raises(ConfigError, match=r"no consumer named 'x' .known: triage, privacy"):
        consumer_named(consumers, "x")
    assert isinstance(consumer_named(consumers[:1], None), Consumer)
