"""The Grafana dashboard queries what the Lambdas publish: every CloudWatch panel's metric, by the service and the
exact dimensions it is published with, is one the launcher or the reporter handler printed as EMF when run here."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import get_args

import pytest
from icebatch.control.gate import Decision
from icebatch.control.handlers import PERMANENT_ERROR_METRICS, TRANSIENT_ERROR_METRIC
from icebatch.core.catalog import open_catalog
from icebatch.core.settings import Settings
from icebatch.tools.invoke import invoke
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.support.consumers import consumers_file
from tests.support.emf import published

pytestmark = pytest.mark.functional
REPO = Path(__file__).resolve().parents[2]
BOARD = json.loads((REPO / "jobimage" / "k8s" / "grafana-dashboard.json").read_text())
EVENTS = REPO / "sam" / "events"


def _queries() -> list[tuple[str, dict[str, str]]]:
    return [
        (t["metricName"], t["dimensions"])
        for p in BOARD["panels"]
        if p["datasource"]["type"] == "cloudwatch"
        for t in p["targets"]
    ]


def _emitted(settings: Settings, capsys: pytest.CaptureFixture[str]) -> set[tuple[str, frozenset[str], str]]:
    """What the handlers publish for a consumer with a daily budget and a backlog: a forced dry run, each other
    decision the launcher counts, a completion and a failure reported."""
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    append_tickets(
        open_catalog(settings).load_table(settings.catalog.source_table), generate_tickets(5, random.Random(1))
    )
    capsys.readouterr()
    forced = {**json.loads((EVENTS / "manual-dry-run.json").read_text()), "force": True}
    [seen] = invoke("launcher", forced, settings)["decisions"]  # a dry run: no job is started
    from icebatch.control.handlers.launcher import count  # imported as invoke imports it (the stack's namespace set)
    from icebatch.control.launcher import LaunchDecision

    for decision in get_args(Decision):  # the names the launcher makes from each decision it can take
        count(LaunchDecision.model_validate({**seen, "decision": decision, "over_budget": decision == "skip"}))
    for name in ("completed.json", "failed.json"):
        event = json.loads((EVENTS / name).read_text())
        invoke("reporter", {**event, "detail": {**event["detail"], "deployment": settings.top.deployment}}, settings)
    return published(capsys.readouterr().out)


def test_every_dashboard_query_finds_a_metric_the_handlers_publish(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a deployment whose consumer has a daily budget, its launcher and reporter run as Lambda runs them
    only = consumers_file(cli_environment / "consumers", {"name": "triage", "budget": {"max_usd_per_day": 5.0}})
    emitted = _emitted(settings.with_overrides(home=cli_environment, consumers_file=only), capsys)
    # when the dashboard's CloudWatch queries are read
    queries = _queries()
    # then each per-consumer one names a metric published with exactly its dimensions (matchExact), by the service
    # it filters on; each per-function one is an error the handlers count (published only when one happens)
    missing = [
        (name, dims)
        for name, dims in queries
        if "consumer" in dims and (dims["service"], frozenset(dims), name) not in emitted
    ]
    assert missing == [], missing
    errors = {(service, name) for service, names in PERMANENT_ERROR_METRICS.items() for name in names}
    errors |= {(service, TRANSIENT_ERROR_METRIC) for service in PERMANENT_ERROR_METRICS}
    assert {(dims["service"], name) for name, dims in queries if "consumer" not in dims} <= errors
    # and the launcher's, the reporter's and the daily budget's are all there
    names = {name for name, _ in queries}
    assert {
        "BacklogRows",
        "OldestUnprocessedAge",
        "JobsLaunched",
        "BudgetRefusals",
        "SpentTodayUsd",
        "BudgetPerDayUsd",
        "CostUsd",
        "RowsProcessed",
    } <= names
    assert {f"Decision_{d}" for d in get_args(Decision)} <= names


def test_the_consumer_variable_lists_the_consumers_the_launcher_publishes(
    settings: Settings, cli_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given what the handlers publish
    only = consumers_file(cli_environment / "consumers", {"name": "triage", "budget": {"max_usd_per_day": 5.0}})
    emitted = _emitted(settings.with_overrides(home=cli_environment, consumers_file=only), capsys)
    # when the dashboard's consumer variable is read
    [variable] = [v for v in BOARD["templating"]["list"] if v["name"] == "consumer"]
    query = variable["query"]
    # then it is filled from the label values of a metric published per consumer, not a fixed list
    assert variable["type"] == "query" and variable["datasource"]["type"] == "cloudwatch"
    assert (query["queryType"], query["dimensionKey"]) == ("dimensionValues", "consumer")
    service = query["dimensionFilters"]["service"]
    assert (service, frozenset({"service", "consumer"}), query["metricName"]) in emitted
    names = [v["name"] for v in BOARD["templating"]["list"]]
    assert names.index("metrics_namespace") < names.index("consumer")  # its query reads the namespace
