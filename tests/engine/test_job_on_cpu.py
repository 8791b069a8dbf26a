"""The job end to end with the real vLLM engine (CPU build) and the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.costs.estimate import run_cost
from icebatch.core.errors import ModelUnavailableError
from icebatch.core.ledger import Key
from icebatch.core.settings import Settings
from icebatch.core.task import DEFAULT_TASK, load_task
from icebatch_job.example.tickets import ensure_source_table, generate
from icebatch_job.job import run_job

from tests.engine.conftest import ledger, read_events

pytestmark = [pytest.mark.engine]
TASK = load_task()


def _results(settings: Settings) -> list[dict]:
    table = ledger(settings).results()
    assert table is not None
    return table.scan().to_arrow().to_pylist()


def test_200_tickets_through_the_real_engine_then_nothing_new(own_settings: Settings) -> None:
    # given 200 generated tickets in 4 snapshots
    s = own_settings
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    generate(table, tickets=200, batches=4, seed=11)
    current = open_catalog(s).load_table(s.catalog.source_table).metadata.current_snapshot_id
    printed: list[str] = []

    # when the job runs
    result = run_job(s, out=printed.append)

    # then every ticket has exactly one result row, each a schema-valid verdict or an explicit error
    assert result.status == "completed" and result.completed is not None
    rows = _results(s)
    assert len(rows) == 200 and len({r["source_id"] for r in rows}) == 200
    for r in rows:
        assert r["status"] in {"ok", "invalid_output", "inference_error"}
        if r["status"] == "ok":
            jsonschema.validate({k: r[k] for k in TASK.output_fields if r[k] is not None}, TASK.answer_schema)
            assert json.loads(r["raw_output"])["category"] == r["category"]
        else:
            assert r["error"] and r["raw_output"] is not None
        assert r["num_input_tokens"] > 0 and r["run_id"] == result.plan.run_id
        assert (r["task"], r["task_version"]) == ("ticket-triage", 1)
    assert sum(r["status"] == "ok" for r in rows) >= 190  # structured output keeps the tiny model's answers valid
    # and the watermark moved in the same commit as the rows, with the totals
    results = ledger(s).results()
    snap = results.metadata.current_snapshot()
    assert snap.summary[Key.WATERMARK] == str(current)
    assert snap.summary["added-records"] == "200"
    assert int(snap.summary["icebatch.output-tokens"]) == sum(r["num_generated_tokens"] for r in rows)
    # and the completion event carries the same numbers
    completed = [e for e in read_events(s) if e["detail-type"] == "Batch Job Completed"]
    assert len(completed) == 1
    detail = completed[0]["detail"]
    assert (detail["rows"], detail["tokens"]["output"]) == (200, int(snap.summary["icebatch.output-tokens"]))
    assert detail["cost"]["lifetime_cost"] > 0
    # and its cost is the one `icebatch runs` and `costs` read from the ledger, to the last digit: the same record
    recorded = ledger(s).find_run(result.plan.run_id)
    assert recorded is not None
    assert detail["cost"] == run_cost(recorded.totals(s.billing()), s).model_dump(mode="json")
    # and start-up (to the first token) is part of the engine time, ending before the first result
    assert 0 < detail["engine_startup_seconds"] < detail["first_result_seconds"] < detail["engine_seconds"]
    # and within it, as vLLM timed them, the checkpoint's load and the warm-up, each reported
    weights, warm_up = detail["engine_weights_seconds"], detail["engine_warmup_seconds"]
    assert weights > 0 and warm_up > 0 and weights + warm_up < detail["engine_startup_seconds"]
    assert recorded.totals(s.billing()).engine_weights_seconds == pytest.approx(weights, abs=0.001)
    report = "\n".join(printed)
    assert f"weights {weights:.1f} s, warm-up {warm_up:.1f} s" in report
    assert "INCREMENTAL STATE" in report and "BATCH SUMMARY" in report and "TOKENOMICS" in report

    # when it runs again with nothing new: "new rows : 0" (no noun named) and no engine (vllm/ray not even imported)
    code = (  # the RayJob's entrypoint, python -m icebatch_job run
        "import sys; from icebatch_job.cli import main; rc = main(['run']); "
        "assert 'vllm' not in sys.modules and 'ray' not in sys.modules, 'engine started'; sys.exit(rc)"
    )
    env = {
        "ICEBATCH_HOME": str(s.home),
        "ICEBATCH_MODEL_SOURCE": str(s.engine.model_source),
        "ICEBATCH_CONSUMERS_FILE": str(s.launch.consumers_file),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "new rows              : 0" in done.stdout


def test_unparseable_answers_are_kept_with_status_and_raw_text(own_settings: Settings, tmp_path: Path) -> None:
    # given new tickets and a task whose max_tokens cuts every answer short
    s = own_settings
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=30, batches=1, seed=12)
    spec = json.loads(DEFAULT_TASK.read_text())
    spec["sampling"]["max_tokens"] = 8
    (tmp_path / "short.json").write_text(json.dumps(spec))
    (tmp_path / "consumers.yaml").write_text("consumers: [{name: triage, task: short.json}]")
    before = ledger(s).watermark().source_snapshot_id

    # when the job runs
    result = run_job(s.with_overrides(consumers_file=tmp_path / "consumers.yaml"), out=lambda _: None)

    # then the 30 rows are there, each invalid_output with the model's raw text and the reason
    assert result.status == "completed" and result.completed is not None
    new = [r for r in _results(s) if r["run_id"] == result.plan.run_id]
    assert len(new) == 30
    assert {r["status"] for r in new} == {"invalid_output"}
    for r in new:
        assert r["raw_output"] and r["raw_output"].startswith("{") and "not JSON" in r["error"]
        assert r["category"] is None  # never a made-up label
        assert r["num_generated_tokens"] == 8
    assert result.completed.rows_error == 30 and result.completed.rows_by_status == {"invalid_output": 30}
    # and the watermark still advanced: the rows are accounted for, visibly
    assert ledger(s).watermark().source_snapshot_id != before


@pytest.mark.parametrize("where", ["folder", "hub"])
def test_a_missing_model_fails_fast_with_a_failed_event(
    own_settings: Settings, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a model that is not where it is said to be: a local folder, or a hub id never downloaded (offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = str(tmp_path / "no-such-model") if where == "folder" else "org/never-downloaded"
    s = own_settings.with_overrides(model_source=source)
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=5, batches=1, seed=13)
    before = ledger(s).watermark()
    with pytest.raises(ModelUnavailableError, match="ICEBATCH_MODEL_SOURCE"):
        run_job(s, out=lambda _: None)
    failed = [e for e in read_events(s) if e["detail-type"] == "Batch Job Failed"]
    assert failed[-1]["detail"]["error_type"] == "ModelUnavailableError"
    assert failed[-1]["detail"]["stage"] == "start" and failed[-1]["detail"]["retryable"] is False
    assert ledger(s).watermark() == before  # nothing committed; the range stays pending
    assert ledger(s).plan() is not None
