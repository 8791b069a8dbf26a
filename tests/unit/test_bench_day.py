"""bench.day: the simulated day of triggers, and the example consumers' defaults it chose."""

from __future__ import annotations

import json

import pytest
from icebatch.core.consumers import load_consumers
from icebatch.core.settings import Settings

from bench.common import RESULTS
from bench.day import GPUS, POLICIES, PRODUCT, Day, scenario_settings, writer

pytestmark = pytest.mark.unit


def test_the_example_consumers_run_at_the_defaults_the_simulated_day_chose() -> None:
    # given the latest `python -m bench.day` and the example consumers as shipped
    day = json.loads((RESULTS / "day-latest.json").read_text())
    shipped = {c.name: c for c in load_consumers(Settings())}
    # then the results were made with the consumers as shipped, and their staleness is the one the day chose
    assert {c["name"]: c["max_staleness_seconds"] for c in day["consumers"]} == {
        n: c.max_staleness_seconds for n, c in shipped.items()
    }, "consumers.yaml changed since the last `python -m bench.day`: run it again"
    assert {c.max_staleness_seconds for c in shipped.values()} == {day["chosen_max_staleness_s"]}
    # and at those defaults, in every scenario, the product's policy pays no more per 1k rows than the batch APIs
    # for the same tokens, keeps every row within its max staleness, and starts at least 5x fewer jobs than a job
    # per threshold crossing
    results = day["results"]
    assert day["product_policy"] == PRODUCT.name
    for r in (r for r in results if r["policy"] == PRODUCT.name):
        today = next(
            t
            for t in results
            if t["policy"] == POLICIES[0].name and t["gpu"] == r["gpu"] and t["startup_s"] == r["startup_s"]
        )
        assert r["usd_per_1k_rows"] <= r["batch_usd_per_1k_rows"], r
        assert all(r["worst_staleness_s"][c] <= r["max_staleness_s"][c] for c in shipped), r
        assert today["cold_starts"] >= 5 * r["cold_starts"], (today, r)


def test_a_simulated_morning_labels_every_row_once_and_the_gate_starts_fewer_jobs() -> None:
    # given four hours of a streaming writer's commits and the example consumers on an L4 with a 90 s start-up
    commits = [c for c in writer(seed=3, bulk=5000) if c[0] < 4 * 3600]
    committed = sum(rows for _, rows in commits)
    consumers = load_consumers(Settings())
    gpu, startup = GPUS[0], 90
    outcomes = {}
    for policy in (POLICIES[0], PRODUCT):
        day = Day(consumers, scenario_settings(gpu, startup), gpu, startup, policy)
        out = day.run(commits)
        # then every committed row was labelled once or is still waiting, for each consumer
        for name in out.rows:
            assert out.rows[name] + sum(n for _, n in day.pending[name]) == committed
        outcomes[policy.name] = out
    # and the gate starts fewer jobs and pays for fewer GPU-hours than a job per threshold crossing
    today, gated = outcomes[POLICIES[0].name], outcomes[PRODUCT.name]
    assert gated.cold_starts < today.cold_starts and gated.gpu_seconds < today.gpu_seconds
