"""A job that lingers: it keeps its node once its range is committed and takes the commits that land, each as a run of
its own, exactly once; the job's own process (``python -m icebatch_job run --json``) with the real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.ledger import Key
from icebatch.core.settings import Settings
from icebatch.tools.runs import ledger_rows
from icebatch_job.example.tickets import ensure_source_table, generate

from tests.engine.conftest import job_process_env, ledger, read_events
from tests.support.consumers import consumer, consumers_file

pytestmark = [pytest.mark.engine]


def _completed(settings: Settings) -> list[dict]:
    return [e["detail"] for e in read_events(settings) if e["detail-type"] == "Batch Job Completed"]


def _wait_for(what: str, check, job: subprocess.Popen, log: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert job.poll() is None, f"the job ended before {what}: {log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s: {log.read_text()[-4000:]}"
        time.sleep(0.5)


def test_a_lingering_job_takes_the_rows_that_land_as_a_run_of_their_own(own_settings: Settings, tmp_path: Path) -> None:
    # given 40 tickets, and a consumer whose job keeps its node for 600 s while rows land (no cost gate to judge by)
    consumers = consumers_file(
        tmp_path / "consumers", {"name": "triage", "linger_seconds": 600, "cost_reference": "off"}
    )
    s = own_settings.with_overrides(consumers_file=consumers)
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    generate(table, tickets=40, batches=1, seed=21)
    env = job_process_env(s, consumers)

    # when the job runs as a RayJob runs it, and 30 tickets land once its range is committed
    log = tmp_path / "job.log"
    with log.open("w") as err:
        job = subprocess.Popen(
            [sys.executable, "-m", "icebatch_job", "run", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        _wait_for("first run's report", lambda: len(_completed(s)) == 1, job, log)
        generate(open_catalog(s).load_table(s.catalog.source_table), tickets=30, batches=1, seed=22)
        # then the same job takes them, as a run of its own, and lingers again (the rows that landed keep paying)
        _wait_for("second run's report", lambda: len(_completed(s)) == 2, job, log)
        _wait_for("the second wait", lambda: log.read_text().count("lingering up to 600 s") == 2, job, log)
        # and a SIGTERM while it waits (to the job's process, as Kubernetes sends it) ends it cleanly
        job.send_signal(signal.SIGTERM)
        stdout, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    stderr = log.read_text()
    assert job.returncode == 0, stderr[-4000:]
    document = json.loads(stdout)  # one JSON document, both runs in it
    assert document["status"] == "completed" and document["rows"] == 40
    assert document["linger"]["kept"] is True and document["linger"]["seconds"] == 600
    [second] = document["lingered"]
    assert second["status"] == "completed" and second["rows"] == 30
    assert second["run_id"] != document["run_id"]
    assert second["from_snapshot_exclusive"] == document["to_snapshot_inclusive"]
    assert "signal 15: committing the finished rows" in stderr

    # and every ticket has exactly one verdict (counted from the tables, not the job's word)
    results = ledger(s).results()
    assert results is not None
    rows = results.scan().to_arrow()
    source_ids = set(open_catalog(s).load_table(s.catalog.source_table).scan().to_arrow()["ticket_id"].to_pylist())
    assert rows.num_rows == 70 and {str(i) for i in rows["source_id"].to_pylist()} == {str(i) for i in source_ids}
    assert ledger(s).backlog().rows == 0
    # and the ledger records the second run as taken warm, paying its time from the commit before it (the wait
    # included), and the first as paying for the job's last window (which no run follows)
    runs = {r.run_id: r for r in ledger(s).runs()}
    first, warm = runs[document["run_id"]], runs[second["run_id"]]
    assert first.number(Key.LINGER_SECONDS) == 600 and not first.warm
    assert warm.warm and Key.LINGER_SECONDS not in warm.properties
    assert warm.number(Key.JOB_SECONDS) > warm.number(Key.ENGINE_SECONDS) > 0
    reports = _completed(s)
    assert [r["run_id"] for r in reports] == [document["run_id"], second["run_id"]]
    assert reports[0]["cost"]["idle_tail_seconds"] >= 600  # the window, billed to the run it followed
    assert (reports[0]["linger_seconds"], reports[0]["warm"], reports[1]["warm"]) == (600, False, True)
    # and the reports and `icebatch runs` say so
    first_report = (s.home / "reports" / f"{document['run_id']}.completed.txt").read_text()
    warm_report = (s.home / "reports" / f"{second['run_id']}.completed.txt").read_text()
    assert "of which the job's linger window 10.0 min" in first_report
    assert "taken warm by a lingering job" in warm_report
    notes = {r.run_id: r.note for r in ledger_rows(ledger(s), consumer(s), s)}
    assert "taken warm by a lingering job" in notes[second["run_id"]]
    assert "kept the node up to 600 s" in notes[document["run_id"]]
