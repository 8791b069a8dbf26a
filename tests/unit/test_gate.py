from __future__ import annotations

import pytest
from icebatch.gate import GateInput, decide

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
        ({"kind": "schedule", "active_job": "ib-triage-x-a1"}, "skip", "ib-triage-x-a1 is still active"),
        ({"kind": "manual", "force": True, "active_job": "j"}, "skip", "still active"),
        ({"kind": "schedule", "dry_run": True}, "dry_run", "would launch: scheduled drain"),
        ({"kind": "schedule", "failed_attempts": 3}, "skip", "3 attempts from this watermark failed"),
        ({"ignore_reason": "Glue change for a.b"}, "ignored", "Glue change for a.b"),
    ],
)
def test_gate_decisions(kw: dict, decision: str, reason: str) -> None:
    result = decide(g(**kw))
    assert result.decision == decision
    assert reason in result.reason
