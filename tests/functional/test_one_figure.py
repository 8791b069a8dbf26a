"""One figure everywhere: what a run cost, and what a consumer spent in a day, read the same on every surface a
person looks at (the run's report, `runs`, `costs`, its HTML page, `estimate`), from the one record the ledger holds,
printed by one rule (``icebatch.core.costs.money.usd``)."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.costs.estimate import run_cost
from icebatch.core.costs.money import usd
from icebatch.core.events import BatchJobFailed
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.local_bus import LocalBus
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.functional.test_cli import icebatch
from tests.support.consumers import consumer, consumers_file
from tests.support.runs import run_once

pytestmark = pytest.mark.functional
REPO = Path(__file__).resolve().parents[2]


def test_a_runs_cost_and_a_days_spend_read_the_same_on_every_surface(tmp_path: Path) -> None:
    # given two consumers of one table: triage with two runs (of 10 and 25 minutes of GPU), privacy with one
    settings = Settings(home=tmp_path)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(source, generate_tickets(30, random.Random(1)))
    ran = {"triage": [run_once(open_ledger(settings, consumer(settings, "triage")), seconds=600)]}
    ran["privacy"] = [run_once(open_ledger(settings, consumer(settings, "privacy")), seconds=1234.5)]
    append_tickets(source, generate_tickets(20, random.Random(2)))
    ran["triage"].append(run_once(open_ledger(settings, consumer(settings, "triage")), seconds=1500))
    # and what each run cost by the ledger's record of it
    cost: dict[str, float] = {}
    for name, runs in ran.items():
        records = {r.run_id: r for r in open_ledger(settings, consumer(settings, name)).runs()}
        for done in runs:
            assert done is not None
            totals = records[done.plan.run_id].totals(settings.billing())
            cost[done.plan.run_id] = run_cost(totals, settings).lifetime_cost
    assert all(c > 0.01 for c in cost.values()), cost
    spent = {name: sum(cost[r.plan.run_id] for r in runs if r is not None) for name, runs in ran.items()}

    # when a person reads each run's report, then its GPU lifetime cost is the record's, by the one rule
    for run_id, usd_ in cost.items():
        report = icebatch(tmp_path, "report", run_id)
        assert report.returncode == 0, report.stderr
        assert f"cost (GPU lifetime)   : {usd(usd_)}" in report.stdout
    # and `runs` shows the same figure on each run's line
    listed = icebatch(tmp_path, "runs").stdout
    for run_id, usd_ in cost.items():
        [line] = [line for line in listed.splitlines() if run_id in line]
        assert f" {usd(usd_)} " in f"{line} "
    # and `costs` the same day's spend per consumer, and their total
    days = icebatch(tmp_path, "costs").stdout
    for name, total in spent.items():
        [line] = [line for line in days.splitlines() if re.match(rf"\S+\s+{name}\s", line)]
        assert f" {usd(total)} " in line
    assert days.splitlines()[-1].endswith(f": {usd(sum(spent.values()))}")
    # and the HTML page's table the same cells
    page = tmp_path / "costs.html"
    assert icebatch(tmp_path, "costs", "--html", str(page)).returncode == 0
    cells = re.findall(r"<td>([^<]*)</td>", page.read_text())
    for total in spent.values():
        assert usd(total) in cells
    # and `estimate` what each consumer spent today (its daily budget's figure)
    for name, total in spent.items():
        estimate = icebatch(tmp_path, "estimate", "--consumer", name).stdout
        assert f"spent today           : {usd(total)}" in estimate


def test_a_failed_start_is_in_the_days_spend_that_costs_estimate_and_the_launchers_budget_read(tmp_path: Path) -> None:
    # given triage with a run today, then a start that failed today having committed nothing (88.4 s of a GPU at
    # $0.8048 an hour), its event in the local bus's log as the job publishes it, and 20 new tickets since the run
    triage = {"name": "triage", "backlog_threshold": 1, "cost_reference": "off"}  # no cost gate: the budget decides
    consumers = consumers_file(tmp_path / "consumers", triage)
    settings = Settings(home=tmp_path, consumers_file=consumers)
    source = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(source, generate_tickets(30, random.Random(1)))
    ledger = open_ledger(settings, consumer(settings, "triage"))
    done = run_once(ledger, seconds=600)
    assert done is not None
    [record] = [r for r in ledger.runs() if r.run_id == done.plan.run_id]
    ran = run_cost(record.totals(settings.billing()), settings).lifetime_cost
    example = json.loads((REPO / "eventbridge/examples/valid/batch-job-failed.json").read_text())["detail"]
    now = datetime.now(UTC)
    failed = {
        **example,
        "deployment": settings.top.deployment,
        "run_id": f"triage-{now:%Y%m%dT%H%M%S}-0f1a2b",
        "started_at": (now - timedelta(seconds=88.4)).isoformat(),
        "failed_at": now.isoformat(),
    }
    LocalBus(tmp_path).publish(BatchJobFailed.model_validate(failed))
    attempt = 0.8048 * 88.4 / 3600  # the embedded default: no node left idle after it
    append_tickets(source, generate_tickets(20, random.Random(2)))
    env = {"ICEBATCH_CONSUMERS_FILE": str(consumers)}

    # when a person reads `costs`, then the day's spend is the run's and the failed start's
    [line] = [line for line in icebatch(tmp_path, "costs", **env).stdout.splitlines() if " triage " in line]
    assert f" {usd(ran + attempt)} " in line and usd(ran + attempt) != usd(ran)
    # and `estimate` says the same was spent today
    estimate = icebatch(tmp_path, "estimate", **env).stdout
    assert f"spent today           : {usd(ran + attempt)}" in estimate
    # and the launcher reads the same figure against the daily budget
    dry = icebatch(tmp_path, "launch", "--dry-run", "--json", **env)
    [decision] = json.loads(dry.stdout)["decisions"]
    assert decision["spent_today_usd"] == pytest.approx(ran + attempt, abs=1e-6), decision
    # so that a budget the run's cost and the next run's estimate fit in, but not the failed start too, refuses
    budget = ran + decision["estimate_usd"] + attempt / 2
    env["ICEBATCH_CONSUMERS_FILE"] = str(
        consumers_file(tmp_path / "budget", {**triage, "budget": {"max_usd_per_day": budget}})
    )
    [held] = json.loads(icebatch(tmp_path, "launch", "--dry-run", "--json", **env).stdout)["decisions"]
    assert held["over_budget"] and held["reason"].startswith("over budget"), held["reason"]
