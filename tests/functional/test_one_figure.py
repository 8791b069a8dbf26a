"""One figure everywhere: what a run cost, and what a consumer spent in a day, read the same on every surface a
person looks at (the run's report, `runs`, `costs`, its HTML page, `estimate`), from the one record the ledger holds,
printed by one rule (``icebatch.core.costs.money.usd``)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.costs.estimate import run_cost
from icebatch.core.costs.money import usd
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.functional.test_cli import icebatch
from tests.support.consumers import consumer
from tests.support.runs import run_once

pytestmark = pytest.mark.functional


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
