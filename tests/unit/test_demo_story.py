"""`make demo` run again in the same clone tells the new part of its story and ends well (exit 0).

The run itself is the e2e tier's (tests/e2e/test_demo.py: the first run, with the engine); here, what the
demo checks at its end, for a second run in a home that already holds the first run's table and results.
"""

from __future__ import annotations

from typing import Any

import pytest
from icebatch.tools.demo import went_as_expected

pytestmark = pytest.mark.unit


def _launched(consumer: str, rows: int) -> dict[str, Any]:
    return {"consumer": consumer, "decision": "launch", "backlog_rows": rows, "submission": "ran in-process: completed"}


def _skipped(consumer: str, *, over_budget: bool = False) -> dict[str, Any]:
    return {"consumer": consumer, "decision": "skip", "backlog_rows": 0, "over_budget": over_budget}


def _waiting(consumer: str) -> dict[str, Any]:
    return {"consumer": consumer, "decision": "wait", "backlog_rows": 40, "rows_to_pay": 700}


SECOND_RUN = {
    # given a second demo in the same home: 300 new tickets on a table that held 300 labelled ones
    "first": [_launched("triage", 300), _launched("privacy", 300)],
    "second": [_skipped("triage"), _skipped("privacy")],
    "backfill_estimate": {"rows": 600},  # a new task version labels the whole table: both demos' rows
    "third": [_skipped("triage", over_budget=True), _skipped("privacy")],
    "fourth": [_waiting("triage"), _waiting("privacy")],  # a small commit: held by the cost gate
    "fifth": [_launched("triage", 40), _launched("privacy", 40)],  # the same rows, past their staleness
}


def test_a_second_demo_in_the_same_home_goes_as_expected() -> None:
    # when the demo checks its story against the table as it now is, then it went as expected (exit 0)
    assert went_as_expected(**SECOND_RUN, bumped="triage", table_rows=600)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"backfill_estimate": {"rows": 300}}, "a backfill that misses the earlier demo's rows"),
        ({"first": [_launched("triage", 300), {**_launched("privacy", 300), "submission": "failed"}]}, "a job failed"),
        ({"second": [_skipped("triage"), _launched("privacy", 5)]}, "the launcher found work twice"),
        ({"third": [_skipped("triage"), _skipped("privacy")]}, "the over-budget backfill was not refused"),
        ({"first": []}, "nothing was launched"),
        ({"fourth": [_waiting("triage"), _launched("privacy", 40)]}, "a small commit launched a job"),
        ({"fifth": [_launched("triage", 40), _waiting("privacy")]}, "a stale backlog was held"),
    ],
)
def test_a_story_that_went_wrong_is_said_so(change: dict[str, Any], why: str) -> None:
    assert not went_as_expected(**{**SECOND_RUN, **change}, bumped="triage", table_rows=600), why
