from __future__ import annotations

import pytest
from icebatch.control.gate import ActiveJob, GateInput, decide

pytestmark = pytest.mark.unit


def g(**kw) -> GateInput:  # type: ignore[no-untyped-def]
    base = dict(
        kind="append",
        force=False,
        dry_run=False,
        backlog_rows=50,
        oldest_age_seconds=60.0,
        threshold=100,
        max_staleness_seconds=3600,
        active_job=None,
        failed_attempts=0,
        max_attempts=3,
    )
    return GateInput(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "decision", "reason"),
    [
        ({"kind": "schedule", "backlog_rows": 1}, "launch", "scheduled drain of 1 rows"),
        ({"kind": "schedule", "backlog_rows": 0}, "skip", "nothing new"),
        ({"backlog_rows": 100}, "launch", "backlog 100 >= threshold 100"),
        ({"backlog_rows": 99}, "skip", "backlog 99 < threshold 100, oldest waiting 60 s"),
        ({"oldest_age_seconds": 3600.0}, "launch", "oldest row has waited 3600 s >= max staleness 3600 s"),
        ({"oldest_age_seconds": 7200.0, "max_staleness_seconds": 0}, "skip", "< threshold"),
        ({"kind": "manual"}, "skip", "< threshold"),
        ({"kind": "manual", "force": True}, "launch", "forced manual launch (50 rows)"),
        ({"kind": "manual", "force": True, "backlog_rows": 0}, "skip", "nothing new"),
        (
            {"kind": "schedule", "active_job": ActiveJob("ib-triage-x-a1", False)},
            "skip",
            "ib-triage-x-a1 is still active",
        ),
        ({"kind": "manual", "force": True, "active_job": ActiveJob("j", False)}, "skip", "still active"),
        ({"kind": "schedule", "active_job": ActiveJob("j", True)}, "already_launched", "j is already running"),
        ({"kind": "schedule", "estimate_usd": 5.0, "max_usd_per_run": 4.0}, "skip", "over budget: the run is"),
        ({"kind": "schedule", "estimate_usd": 5.0, "max_usd_per_run": 5.0}, "launch", "scheduled drain"),
        (
            {"kind": "schedule", "estimate_usd": 2.0, "spent_today_usd": 9.0, "max_usd_per_day": 10.0},
            "skip",
            "$9.0000 spent today plus an estimated $2.0000",
        ),
        ({"backlog_rows": 99, "estimate_usd": 5.0, "max_usd_per_run": 1.0}, "skip", "< threshold"),  # no launch anyway
        ({"kind": "schedule", "dry_run": True}, "dry_run", "would launch: scheduled drain"),
        ({"kind": "schedule", "failed_attempts": 3}, "skip", "3 attempts from this watermark failed"),
        ({"ignore_reason": "Glue change for a.b"}, "ignored", "Glue change for a.b"),
        # rows deleted since the watermark and none added: their verdicts go at once, whatever the trigger
        ({"kind": "append", "backlog_rows": 0, "removals": 3}, "launch", "3 deleted rows since the watermark"),
        (
            {"kind": "schedule", "backlog_rows": 0, "removals": 3, "active_job": ActiveJob("j", False)},
            "skip",
            "still active",
        ),
        ({"kind": "append", "backlog_rows": 0, "removals": 0}, "skip", "nothing new"),
        # rows rewritten (copy-on-write), none added: a run with no model, then one with it if some had changed
        ({"backlog_rows": 0, "rewritten": 9}, "launch", "9 rows rewritten (copy-on-write) since the watermark"),
        ({"backlog_rows": 0, "removals": 2, "rewritten": 9}, "launch", "2 deleted and 9 rewritten"),
        ({"backlog_rows": 0, "rewritten": 9, "deferred": True}, "launch", "this one has the model"),
    ],
)
def test_gate_decisions(kw: dict, decision: str, reason: str) -> None:
    result = decide(g(**kw))
    assert result.decision == decision
    assert reason in result.reason


def test_a_refusal_for_budget_is_marked_so_that_it_is_counted() -> None:
    refused = decide(g(kind="schedule", estimate_usd=5.0, max_usd_per_run=1.0))
    assert refused.over_budget and refused.decision == "skip" and "icebatch estimate" in refused.reason
    assert not decide(g(kind="schedule")).over_budget


@pytest.mark.parametrize("kind", ["schedule", "append", "manual"])
def test_a_refused_consumer_is_never_launched_whatever_the_trigger(kind: str) -> None:
    from icebatch.control.gate import REFUSALS, Refusal

    # given a consumer whose source table was replaced, with a backlog a launch would take, even forced
    refused = g(kind=kind, force=True, backlog_rows=10_000, refusal=Refusal("source_replaced", "another table"))
    # when the gate decides, then it refuses with the observed reason, before any other consideration
    result = decide(refused)
    assert (result.decision, result.reason) == ("source_replaced", "another table")
    assert result.decision in REFUSALS
    # and a dry run says the same (what would happen)
    assert decide(g(kind=kind, dry_run=True, refusal=Refusal("source_replaced", "x"))).decision == "source_replaced"
