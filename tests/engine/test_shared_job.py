"""A shared job: several consumers' runs through one engine, each exactly once, a failing one failing alone; the job's
own process (``python -m icebatch_job run --with``) with the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.runs import ledger_rows
from icebatch_job.example.tickets import ensure_source_table, generate

from tests.engine.conftest import job_process_env, read_events
from tests.support.consumers import TASKS, consumers_file

pytestmark = [pytest.mark.engine]

ENGINE_ACTOR = ":actor_name:MapWorker(MapBatches(vLLMEngineStageUDF))"  # Ray's log line for each engine's actor


def _unanswerable_task(folder: Path) -> Path:
    """The triage task, but its summary's pattern has an anchor mid-way (``$`` before more): valid JSON Schema (a
    Python regex) that the task's own check lets through (it refuses look-around and the like), which the engine's
    structured output refuses for every row."""
    task = json.loads((TASKS / "triage.json").read_text())
    task["name"] = "midanchor"
    task["output_schema"]["properties"]["summary"]["pattern"] = "^[A-Za-z ]+$[.]?"
    path = folder / "midanchor.json"
    path.write_text(json.dumps(task))
    return path


def _engines_started(home: Path) -> int:
    """Engine actors Ray started, counted from Ray's own worker logs (not the job's word)."""
    logs = {log.resolve() for log in home.glob("ray/session_*/logs/worker-*.out")}  # session_latest: a link
    return sum(ENGINE_ACTOR in log.read_text(errors="replace") for log in logs)


def test_consumers_of_one_model_share_one_engine_and_a_failing_one_fails_alone(
    own_settings: Settings, tmp_path: Path
) -> None:
    # given 70 tickets, and three consumers of one model: triage, privacy, and one whose task the engine refuses
    folder = tmp_path / "consumers"
    consumers = consumers_file(
        folder,
        {"name": "triage", "cost_reference": "off"},
        {"name": "privacy", "task": "privacy", "cost_reference": "off"},
        {"name": "midanchor", "task": _unanswerable_task(tmp_path), "cost_reference": "off"},
    )
    s = own_settings.with_overrides(consumers_file=consumers)
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    generate(table, tickets=70, batches=2, seed=31)
    env = job_process_env(s, consumers)

    # when one job takes the three consumers' runs, as a RayJob runs it
    command = [
        "-m",
        "icebatch_job",
        "run",
        "--json",
        "--consumer",
        "triage",
        "--with",
        "privacy",
        "--with",
        "midanchor",
    ]
    job = subprocess.run(
        [sys.executable, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    # then one engine answered them all
    assert _engines_started(s.home) == 1, job.stderr[-4000:]
    # and the job says a run failed (exit 1) in one JSON document holding the three runs
    assert job.returncode == 1, job.stderr[-4000:]
    document = json.loads(job.stdout)
    runs = {r["consumer"]: r for r in [document, *document["shared"]]}
    assert (runs["triage"]["status"], runs["privacy"]["status"], runs["midanchor"]["status"]) == (
        "completed",
        "completed",
        "failed",
    )
    assert "refuses task 'midanchor''s output_schema" in runs["midanchor"]["reason"]
    # and triage and privacy labelled every ticket exactly once, each in its own results table (counted from the
    # tables), while the failed consumer committed nothing and its rows wait for its next run
    source_ids = {str(i) for i in open_catalog(s).load_table(s.catalog.source_table).scan().to_arrow()["ticket_id"]}
    for name in ("triage", "privacy", "midanchor"):
        ledger = open_ledger(s, consumer_named(load_consumers(s), name))
        results = ledger.results()
        verdicts = results.scan().to_arrow()["source_id"].to_pylist() if results is not None else []
        if name == "midanchor":
            assert verdicts == [] and ledger.backlog().rows == 70
        else:
            assert sorted(verdicts) == sorted(source_ids) and len(verdicts) == 70, name
            assert ledger.backlog().rows == 0
    # and the node is split by tokens: the two runs that ran pay it together, and each report says so
    completed = {
        e["detail"]["consumer"]: e["detail"] for e in read_events(s) if e["detail-type"] == "Batch Job Completed"
    }
    failed = [e["detail"] for e in read_events(s) if e["detail-type"] == "Batch Job Failed"]
    assert [f["consumer"] for f in failed] == ["midanchor"]
    shares = {name: e["cost"]["share"] for name, e in completed.items()}
    assert shares.keys() == {"triage", "privacy"} and 0.99 < sum(shares.values()) <= 1.0
    assert 0 < shares["triage"] < 1 and set(completed["triage"]["shared_with"]) == {"privacy", "midanchor"}
    assert completed["privacy"]["cost"]["sharing_saved"] > 0
    report = (s.home / "reports" / f"{runs['privacy']['run_id']}.completed.txt").read_text()
    assert f"paid {shares['privacy']:.0%} of the node by tokens" in report
    triage = consumer_named(load_consumers(s), "triage")
    notes = {r.run_id: r.note for r in ledger_rows(open_ledger(s, triage), triage, s)}
    assert "one engine with privacy, midanchor" in notes[runs["triage"]["run_id"]]
