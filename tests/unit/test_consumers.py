"""The consumers file: what a deployment declares, validated, with errors naming the file and entry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.core.consumers import (
    DEFAULT_CONSUMERS_FILE,
    MAX_JOB_CONSUMER_BYTES,
    Consumer,
    consumer_named,
    load_consumers,
)
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
        ("consumers: [{name: a, task: tasks/triage.json, tresh: 5}]", "entry 1: tresh: no such key; the keys are name"),
        (
            "consumers: [{name: a, task: tasks/triage.json, backlog_treshold: 5}]",
            re.escape("backlog_treshold: no such key (did you mean 'backlog_threshold'?)"),
        ),
        (
            "consumers: [{name: a, task: tasks/triage.json, budget: {max_usd_per_rn: 5}}]",
            re.escape(
                "budget.max_usd_per_rn: no such key (did you mean 'max_usd_per_run'?); the keys are max_usd_per_run, "
            ),
        ),
        ("consumers: [{name: a, task: tasks/triage.json}, {name: a, task: tasks/triage.json}]", "share the name 'a'"),
        ("consumers: [{name: a, task: tasks/triage.json, results_table: support.tickets}]", "cannot be the source"),
        ("consumers: [{name: a, task: tasks/triage.json, budget: {max_usd_per_run: -1}}]", "greater than 0"),
        ("consumers: [{name: a, task: tasks/triage.json, row_noun: 'Tickets!'}]", "entry 1: row_noun: .*pattern"),
        ("consumers: {", r"is not YAML: expected .* \(line 1, column 13\)$"),
        # a key given twice is ambiguous (PyYAML keeps the last one): the threshold would silently be 1000
        (
            "consumers:\n- name: a\n  task: tasks/triage.json\n  backlog_threshold: 10\n  backlog_threshold: 1000\n",
            r"consumers.yaml: key 'backlog_threshold' is given twice \(ambiguous\) \(line 5, column 3\)",
        ),
        ("consumers: [{name: a, task: tasks}]", "entry 1: task file .*tasks is a folder, not a file"),
        # a task path holding a newline is quoted escaped: the error stays one line
        ('consumers: [{name: a, task: "x\\ny.json"}]', r"entry 1: task file .*x\\ny.json does not exist"),
        ("consumers: [{name: a, task: tasks/latin1.json}]", r"entry 1: task file .*latin1.json is not UTF-8 text"),
        ("consumers: [{name: a, task: tasks/twice.json}]", "entry 1: task file .*twice.json: duplicate key 'version'"),
    ],
)
def test_a_bad_consumers_file_is_one_clear_error(tmp_path: Path, body: str, message: str) -> None:
    # given a consumers file (and its task files) with a mistake in it
    settings = write(tmp_path, body)
    (tmp_path / "tasks" / "latin1.json").write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    (tmp_path / "tasks" / "twice.json").write_text('{"version": 1, "version": 2}')
    # when it is loaded, then the error is one line saying which file, which entry and what is wrong
    with pytest.raises(ConfigError, match=message) as error:
        load_consumers(settings)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("folder", "is a folder, not a file (ICEBATCH_CONSUMERS_FILE)"),
        ("not-utf8", "is not UTF-8 text (byte 0)"),
        ("/dev/zero", "holds more than 1,048,576 bytes: is it the right file?"),  # endless: read no further
    ],
)
def test_a_consumers_file_that_is_not_a_text_file_is_one_clear_error(tmp_path: Path, where: str, expected: str) -> None:
    # given ICEBATCH_CONSUMERS_FILE naming a folder, a file that is not UTF-8, or a device that never ends
    (tmp_path / "not-utf8").write_bytes(b"\xff\xfe consumers")
    (tmp_path / "folder").mkdir()
    # when the consumers are loaded, then it says what the file is and which setting names it
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_consumers(Settings(consumers_file=tmp_path / where))


def test_naming_a_consumer() -> None:
    consumers = load_consumers(Settings())
    assert consumer_named(consumers, "privacy").name == "privacy"
    with pytest.raises(ConfigError, match="name one with --consumer"):
        consumer_named(consumers, None)
    with pytest.raises(ConfigError, match=r"no consumer named 'x' .known: triage, privacy"):
        consumer_named(consumers, "x")
    assert isinstance(consumer_named(consumers[:1], None), Consumer)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Triage Team"}, "name: 'Triage Team' must start with a letter"),
        ({"backlog_threshold": "100"}, "backlog_threshold: Input should be a valid integer"),
        ({"max_gpus": 0}, "max_gpus: Input should be greater than or equal to 1"),
        ({"max_staleness_seconds": -1}, "max_staleness_seconds: Input should be greater than or equal to 0"),
        ({"task": {"version": 0}}, "task.version: Input should be greater than or equal to 1"),
        ({"task": {"sampling": {"max_tokens": 160, "temperature": "0"}}}, "task.sampling.temperature"),
    ],
)
def test_a_hand_written_job_consumer_is_held_to_the_consumers_file_rules(change: dict, message: str) -> None:
    # given the consumer a launcher hands its job, edited by hand (`icebatch job run` with the variable set)
    triage = json.loads(load_consumers(Settings())[0].to_json())
    for key, value in change.items():
        triage[key] = triage[key] | value if isinstance(value, dict) else value
    # when the job loads it, then it is one clear error, before anything starts
    with pytest.raises(ConfigError, match=rf"ICEBATCH_JOB_CONSUMER is not a consumer: {message}"):
        load_consumers(Settings(job_consumer=json.dumps(triage)))


def test_a_task_whose_answers_leave_no_room_for_a_prompt_is_refused_before_a_launch(tmp_path: Path) -> None:
    # given the triage task (up to 160 output tokens) and a context of 180 tokens
    s = write(tmp_path, "consumers: [{name: a, task: tasks/triage.json}]").with_overrides(max_model_len=180)
    # when the launcher (or the job) loads its consumers, then it says what to change
    with pytest.raises(
        ConfigError, match=r"consumer 'a'.*max_tokens \(160\) leaves 20 .*ICEBATCH_MAX_MODEL_LEN \(180\)"
    ):
        load_consumers(s)
    # and the same task hands to a job the same way
    job = s.with_overrides(
        job_consumer=load_consumers(write(tmp_path, "consumers: [{name: a, task: tasks/triage.json}]"))[0].to_json()
    )
    with pytest.raises(ConfigError, match="raise ICEBATCH_MAX_MODEL_LEN or lower max_tokens"):
        load_consumers(job)


def _with_system_prompt(tmp_path: Path, size: int) -> Settings:
    """The triage consumer whose task's system prompt is ``size`` characters long."""
    s = write(tmp_path, "consumers: [{name: a, task: tasks/long.json}]")
    spec = json.loads((tmp_path / "tasks" / "triage.json").read_text())
    spec["system_prompt"] = ("Label the ticket. " * (size // 18 + 1))[:size]
    (tmp_path / "tasks" / "long.json").write_text(json.dumps(spec))
    return s


def test_a_task_too_long_to_hand_to_a_job_is_refused_before_a_launch(tmp_path: Path) -> None:
    # given a task whose prompt makes the consumer larger than one environment variable can hold
    s = _with_system_prompt(tmp_path, 140_000)
    # when the launcher loads its consumers, then it is refused, saying why and what to change
    with pytest.raises(
        ConfigError,
        match=r"consumer 'a' is 14\d,\d{3} bytes as the launcher hands it to a job .* more than the 131,049 an "
        r"environment variable can hold .* Fix: shorten the task's prompt or output schema",
    ):
        load_consumers(s)


def test_the_largest_consumer_accepted_reaches_a_job_process(tmp_path: Path) -> None:
    # given a consumer just under the limit (its prompt grown until the next byte would be refused)
    base = len(load_consumers(_with_system_prompt(tmp_path, 0))[0].to_json().encode())
    consumer = load_consumers(_with_system_prompt(tmp_path, MAX_JOB_CONSUMER_BYTES - base))[0]
    assert len(consumer.to_json().encode()) == MAX_JOB_CONSUMER_BYTES
    # when a process starts with it in ICEBATCH_JOB_CONSUMER (as the job's pod does), then it starts and reads it
    code = "import os; print(len(os.environ['ICEBATCH_JOB_CONSUMER']))"
    env = {"PATH": os.environ.get("PATH", ""), "ICEBATCH_JOB_CONSUMER": consumer.to_json()}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(done.stdout) == MAX_JOB_CONSUMER_BYTES
    # and one byte more would not have started (what the check prevents)
    with pytest.raises(OSError, match="Argument list too long"):
        subprocess.run(["true"], env={**env, "ICEBATCH_JOB_CONSUMER": consumer.to_json() + "x"}, check=False)
