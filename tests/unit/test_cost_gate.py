"""The cost gate: a run's price per 1k rows against the consumer's ceiling, and what a GPU lease spreads it over."""

from __future__ import annotations

import pytest
from icebatch.control.gate import GateInput, decide, staleness_lead
from icebatch.core.consumers import load_consumers
from icebatch.core.costs.estimate import cost_check, estimate_run
from icebatch.core.costs.lease import Member, fixed_shares, group_check, idle_window_seconds, keeps_node
from icebatch.core.errors import ConfigError
from icebatch.core.ledger import Key, RunRecord
from icebatch.core.settings import Settings

from tests.support.consumers import consumers_file, triage

pytestmark = pytest.mark.unit
# an L4 on EKS: 90 s of start-up measured, 25 rows/s, the idle tail of the defaults (60 s TTL + 30 s consolidation)
EKS = Settings(backend="kuberay", gpu_hourly_rate=0.8048)
CONSUMER = triage()


def measured(rows: int = 10_000, *, startup: float = 90, rows_per_s: float = 25, version: int = 1) -> RunRecord:
    streaming = rows / rows_per_s
    props = {
        Key.ROWS: str(rows),
        Key.INPUT_TOKENS: str(rows * 155),
        Key.OUTPUT_TOKENS: str(rows * 38),
        Key.ENGINE_SECONDS: str(startup + streaming),
        Key.ENGINE_STARTUP_SECONDS: str(startup),
        Key.JOB_SECONDS: str(startup + streaming),
        Key.GPUS: "1",
    }
    return RunRecord("r", 1, 0, None, 1, CONSUMER.task.name, version, props)


RUNS = [measured()]


def test_a_small_run_does_not_pay_and_the_rows_that_would_are_exact() -> None:
    # given a consumer compared with the cheapest batch API (the default), and 150 rows waiting
    check = cost_check(150, CONSUMER, RUNS, EKS)
    assert check is not None
    # then the run costs more per 1k rows than the batch API would charge for the same tokens
    assert not check.pays and check.usd_per_1k_rows > check.ceiling.usd_per_1k_rows
    assert check.ceiling.basis == "bedrock-batch:llama3-1-8b-instruct for the same tokens"
    # and rows_to_pay is the fewest rows whose run pays: one row fewer does not
    assert check.rows_to_pay is not None
    at = cost_check(check.rows_to_pay, CONSUMER, RUNS, EKS)
    below = cost_check(check.rows_to_pay - 1, CONSUMER, RUNS, EKS)
    assert at is not None and at.pays and below is not None and not below.pays
    assert f"{check.rows_to_pay - 150:,} more rows make it pay" in check.summary()


def test_the_ceiling_is_the_consumers_own_else_its_reference_else_none() -> None:
    own = cost_check(150, CONSUMER.model_copy(update={"max_usd_per_1k_rows": 5.0}), RUNS, EKS)
    assert own is not None and own.pays and own.ceiling.basis == "max_usd_per_1k_rows"
    named = cost_check(150, CONSUMER.model_copy(update={"cost_reference": "openai-batch:gpt-4o-mini"}), RUNS, EKS)
    assert named is not None and named.ceiling.basis == "openai-batch:gpt-4o-mini for the same tokens"
    # the same tokens at gpt-4o-mini's batch price: $0.075 in, $0.30 out per 1M
    assert named.ceiling.usd_per_1k_rows == pytest.approx((155 * 0.075 + 38 * 0.30) / 1000)
    assert cost_check(150, CONSUMER.model_copy(update={"cost_reference": "off"}), RUNS, EKS) is None
    assert cost_check(150, CONSUMER, RUNS, EKS.with_overrides(batch_api_prices="off")) is None


def test_a_gpu_slower_than_the_batch_api_per_row_never_pays_and_says_so() -> None:
    slow = [measured(rows_per_s=0.5)]
    check = cost_check(1000, CONSUMER, slow, EKS)
    assert check is not None and check.rows_to_pay is None
    assert "no run pays, generation alone costs" in check.summary()


def test_a_cost_reference_the_deployment_does_not_price_is_refused_with_the_closest_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = consumers_file(tmp_path, {"name": "triage", "cost_reference": "openai-batch:gpt-4o-mimi"})
    with pytest.raises(ConfigError, match="did you mean 'openai-batch:gpt-4o-mini'"):
        load_consumers(Settings(consumers_file=path))


def gate(**kw) -> GateInput:  # type: ignore[no-untyped-def]
    base = dict(
        kind="append",
        force=False,
        dry_run=False,
        backlog_rows=150,
        oldest_age_seconds=600.0,
        threshold=100,
        max_staleness_seconds=28_800,
        active_job=None,
        failed_attempts=0,
        max_attempts=3,
        cost=cost_check(150, CONSUMER, RUNS, EKS),
    )
    return GateInput(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "decision", "reason"),
    [
        ({}, "wait", "waiting for a run that pays: $"),
        ({}, "wait", "the oldest row has waited 600 s of max staleness 28800 s"),
        ({"backlog_rows": 50}, "skip", "backlog 50 < threshold 100"),  # below the threshold: not even priced
        ({"lead_seconds": 28_300.0}, "launch", "(+ 28300 s: a run's first commit, the next trigger's wait)"),
        ({"lead_seconds": 28_300.0}, "launch", "; launched though $"),
        ({"max_staleness_seconds": 0}, "wait", "no max staleness: it waits until a run pays"),
        ({"kind": "schedule"}, "launch", "scheduled drain of 150 rows"),
        ({"kind": "manual", "force": True}, "launch", "forced manual launch (150 rows)"),
        ({"kind": "manual"}, "wait", "waiting for a run that pays"),
        ({"resume": "run r: 10 of 150 rows committed"}, "launch", "resume run r"),
        ({"cost": cost_check(150, CONSUMER, RUNS, EKS.with_overrides(gpu_hourly_rate=0.001))}, "launch", "it pays"),
        ({"dry_run": True}, "wait", "waiting"),  # a dry run says what a launch would decide
    ],
)
def test_the_gate_waits_for_a_run_that_pays_or_for_staleness(kw: dict, decision: str, reason: str) -> None:
    result = decide(gate(**kw))
    assert result.decision == decision and reason in result.reason, result.reason


def test_the_staleness_lead_is_the_first_commit_and_the_next_triggers_wait() -> None:
    # 10 commits over the last 900 s: one every 100 s; a run's first chunk commits 140 s after its launch
    assert staleness_lead(140.0, 900.0, 10) == pytest.approx(140 + 100)
    assert staleness_lead(140.0, 300.0, 1) == pytest.approx(140 + 300)  # one commit: its age is the gap known
    assert staleness_lead(140.0, None, 0) == 140.0
    e = estimate_run(5000, CONSUMER, RUNS, EKS)
    assert e.first_commit_seconds == pytest.approx(90 + 1200 / 25)  # start-up, then a chunk of 1,200 rows


def test_two_consumers_sharing_a_job_pay_one_start_up_where_neither_pays_alone() -> None:
    privacy = CONSUMER.model_copy(update={"name": "privacy"})
    alone = [cost_check(2000, c, RUNS, EKS) for c in (CONSUMER, privacy)]
    assert all(c is not None and not c.pays for c in alone)
    shared = group_check([Member(CONSUMER, 2000, RUNS), Member(privacy, 2000, RUNS)], EKS)
    assert shared is not None and shared.pays and shared.rows == 4000
    # one fixed part: the pair costs less than either alone per row
    assert alone[0] is not None and shared.usd_per_1k_rows < alone[0].usd_per_1k_rows
    assert fixed_shares({"triage": 300, "privacy": 100}) == {"triage": 0.75, "privacy": 0.25}
    assert fixed_shares({"a": 0, "b": 0}) == {"a": 0.5, "b": 0.5}


def test_a_drained_job_keeps_its_node_for_a_burst_not_for_a_trickle() -> None:
    window = idle_window_seconds(CONSUMER, RUNS, EKS)
    assert window == pytest.approx(90 + 90)  # what a cold start costs in time: start-up and idle tail
    # a burst: 20,000 rows landed in the last window would pay for a cold start of their own
    assert keeps_node([Member(CONSUMER, 20_000, RUNS)], EKS)
    # a trickle: 150 rows would not; nor would nothing
    assert not keeps_node([Member(CONSUMER, 150, RUNS)], EKS)
    assert not keeps_node([Member(CONSUMER, 0, RUNS)], EKS)
    # without a price to judge by, a job lingers only where the consumer sets its window
    ungated = CONSUMER.model_copy(update={"cost_reference": "off"})
    assert not keeps_node([Member(ungated, 150, RUNS)], EKS)
    assert keeps_node([Member(ungated.model_copy(update={"linger_seconds": 120}), 150, RUNS)], EKS)
    assert idle_window_seconds(ungated.model_copy(update={"linger_seconds": 120}), RUNS, EKS) == 120
