"""`icebatch validate`: every consumer against its table, results and model, one line per problem, exit 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.cli import main as icebatch_main
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.support.consumers import TASKS, consumers_file, triage
from tests.support.runs import run_once

pytestmark = pytest.mark.functional


@pytest.fixture
def home(cli_environment: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A table of tickets, and the triage consumer alone."""
    only = consumers_file(cli_environment / "consumers", {"name": "triage"})
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(only))
    settings = Settings(home=cli_environment, consumers_file=only)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(source, generate_tickets(6, random.Random(1)))
    return cli_environment


def _validate(capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    status = icebatch_main(["validate"])
    return status, capsys.readouterr().out.strip().splitlines()


def test_a_consumer_that_can_run_is_ok_in_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = _validate(capsys)
    assert status == 0 and len(lines) == 1 and lines[0].startswith("triage: ok ("), lines
    assert "columns: 5 columns by field id" in lines[0]
    # and --json is one document saying the same
    assert icebatch_main(["validate", "--json"]) == 0
    [verdict] = json.loads(capsys.readouterr().out)
    assert verdict["ok"] is True and verdict["problems"] == []


def test_a_misspelt_column_is_one_line_and_exit_2(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a task whose prompt reads a column the table does not have
    task = json.loads((TASKS / "triage.json").read_text())
    task["input_columns"] = ["subjet" if c == "subject" else c for c in task["input_columns"]]
    task["user_template"] = task["user_template"].replace("{subject}", "{subjet}")
    (tmp_path / "task.json").write_text(json.dumps(task))
    path = consumers_file(tmp_path / "c", {"name": "triage"})
    path.write_text(path.read_text().replace(str(TASKS / "triage.json"), str(tmp_path / "task.json")))
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(path))
    # when validated, then one line names the consumer, the check and the column, and the status is 2
    status, lines = _validate(capsys)
    assert status == 2 and lines == [lines[0]] and lines[0].startswith("triage: columns: "), lines
    assert "has no column 'subjet'" in lines[0]


def test_a_column_dropped_after_a_run_is_caught(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # given a consumer that labelled its table, whose source then drops a column its prompt reads
    settings = Settings(home=home, consumers_file=home / "consumers" / "consumers.yaml")
    ledger = open_ledger(settings, triage(settings))
    run_once(ledger)
    with ledger.source().update_schema() as update:
        update.delete_column("channel")
    # when validated, then it says so before any job
    status, lines = _validate(capsys)
    assert status == 2 and len(lines) == 1 and "'channel'" in lines[0] and "dropped" in lines[0], lines


def test_a_model_whose_context_is_shorter_than_the_setting_is_caught(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a model folder whose context is 512 tokens, and ICEBATCH_MAX_MODEL_LEN 2048 (the default)
    model = tmp_path / "short-model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512})
    )
    monkeypatch.setenv("ICEBATCH_MODEL_SOURCE", str(model))
    # when validated, then the model's line says what to lower
    status, lines = _validate(capsys)
    assert status == 2 and len(lines) == 1 and lines[0].startswith("triage: model: "), lines
    assert "at most 512 tokens" in lines[0] and "ICEBATCH_MAX_MODEL_LEN" in lines[0]


def test_a_model_the_consumer_names_and_no_folder_holds_points_at_the_consumers_entry(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a consumer whose own `model:` names a folder that is not there
    path = consumers_file(tmp_path / "c", {"name": "triage", "model": str(tmp_path / "no-such-model")})
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(path))
    # when validated, then the fix named is that entry of the consumers file, not the deployment's setting
    status, lines = _validate(capsys)
    assert status == 2 and len(lines) == 1 and lines[0].startswith("triage: model: "), lines
    assert f"Fix the `model:` of consumer 'triage' in {path}" in lines[0]
    assert "Set ICEBATCH_MODEL_SOURCE" not in lines[0]


def test_a_misspelt_source_table_names_the_table_meant(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = consumers_file(tmp_path / "c", {"name": "triage", "source_table": "support.tickts"})
    monkeypatch.setenv("ICEBATCH_CONSUMERS_FILE", str(path))
    status, lines = _validate(capsys)
    assert status == 2 and "(did you mean 'support.tickets'?)" in "\n".join(lines), lines
    assert "consumer's `source_table` in the consumers file" in "\n".join(lines)


def test_a_results_table_whose_columns_cannot_take_the_answers_is_caught(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a results table made by someone else, whose `summary` is a number
    settings = Settings(home=home, consumers_file=home / "consumers" / "consumers.yaml")
    consumer = triage(settings)
    catalog = open_catalog(settings)
    catalog.create_table(consumer.results_table, pa.schema([pa.field("summary", pa.int64())]))
    # when validated, then the clash is named
    status, lines = _validate(capsys)
    assert status == 2 and len(lines) == 1 and lines[0].startswith("triage: results: "), lines
    assert "summary is long, the task answers string" in lines[0]
