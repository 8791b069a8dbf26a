"""A shared job that lingers: once its consumers' ranges are committed it keeps its node for all of them, and the rows
that land make a round of warm runs through one engine, each exactly once; the job's own process, the real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import consumer_named, load_consumers
from icebatch.core.ledger import Key, open_ledger
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import ensure_source_table, generate

from tests.engine.conftest import job_process_env, read_events
from tests.engine.test_lingering_job import _wait_for
from tests.support.consumers import consumers_file

pytestmark = [pytest.mark.engine]


def test_a_shared_job_lingers_for_all_its_consumers_and_takes_the_rows_that_land_once_for_each(
    own_settings: Settings, tmp_path: Path
) -> None:
    # given 20 tickets, and triage and privacy, consumers of one model whose job keeps its node 600 s while rows land
    consumers = consumers_file(
        tmp_path / "consumers",
        {"name": "triage", "linger_seconds": 600, "cost_reference": "off"},
        {"name": "privacy", "task": "privacy", "linger_seconds": 600, "cost_reference": "off"},
    )
    s = own_settings.with_overrides(consumers_file=consumers)
    generate(ensure_source_table(open_catalog(s), s.catalog.source_table), tickets=20, batches=1, seed=41)
    env = job_process_env(s, consumers)

    def completed() -> list[dict]:
        return [e["detail"] for e in read_events(s) if e["detail-type"] == "Batch Job Completed"]

    # when one job takes both consumers' runs, as a RayJob runs it, and 10 tickets land once both are committed
    log = tmp_path / "job.log"
    command = ["-m", "icebatch_job", "run", "--json", "--consumer", "triage", "--with", "privacy"]
    with log.open("w") as err:
        job = subprocess.Popen(
            [sys.executable, *command], env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
    try:
        _wait_for("both first runs' reports", lambda: len(completed()) == 2, job, log)
        _wait_for("the first wait", lambda: "triage, privacy: lingering up to 600 s" in log.read_text(), job, log)
        generate(open_catalog(s).load_table(s.catalog.source_table), tickets=10, batches=1, seed=42)
        # then the same job takes them for both consumers, a warm run each, and lingers again
        _wait_for("both warm runs' reports", lambda: len(completed()) == 4, job, log)
        _wait_for("the second wait", lambda: log.read_text().count("lingering up to 600 s") == 2, job, log)
        # and a SIGTERM while it waits ends it cleanly
        job.send_signal(signal.SIGTERM)
        stdout, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    stderr = log.read_text()
    assert job.returncode == 0, stderr[-4000:]
    document = json.loads(stdout)  # one JSON document: the first round, and the round it took while lingering
    assert document["linger"]["kept"] is True and document["linger"]["seconds"] == 600
    first = {r["consumer"]: r for r in [document, *document["shared"]]}
    [round_two] = document["lingered"]
    second = {r["consumer"]: r for r in [round_two, *round_two["shared"]]}
    for name in ("triage", "privacy"):
        assert (first[name]["status"], first[name]["rows"]) == ("completed", 20), first[name]
        assert (second[name]["status"], second[name]["rows"]) == ("completed", 10), second[name]
        assert second[name]["from_snapshot_exclusive"] == first[name]["to_snapshot_inclusive"]

    # and each consumer labelled every ticket exactly once, in its own results table (counted from the tables)
    source_ids = {str(i) for i in open_catalog(s).load_table(s.catalog.source_table).scan().to_arrow()["ticket_id"]}
    for name in ("triage", "privacy"):
        ledger = open_ledger(s, consumer_named(load_consumers(s), name))
        results = ledger.results()
        assert results is not None
        verdicts = [str(i) for i in results.scan().to_arrow()["source_id"].to_pylist()]
        assert sorted(verdicts) == sorted(source_ids) and len(verdicts) == 30, name
        assert ledger.backlog().rows == 0
        # and its first run pays its share of the job's last window, its warm run its share of the wait
        runs = {r.run_id: r for r in ledger.runs()}
        cold, warm = runs[first[name]["run_id"]], runs[second[name]["run_id"]]
        assert cold.number(Key.LINGER_SECONDS) == 600 and not cold.warm and 0 < cold.share < 1
        assert warm.warm and Key.LINGER_SECONDS not in warm.properties and 0 < warm.share < 1
    shares = {(e["consumer"], e["warm"]): e["cost"]["share"] for e in completed()}
    assert 0.99 < shares[("triage", False)] + shares[("privacy", False)] <= 1.0
    assert 0.99 < shares[("triage", True)] + shares[("privacy", True)] <= 1.0
