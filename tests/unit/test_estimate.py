"""The estimate learns a consumer's pace from its own runs, and bills the idle tail only where it is paid."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from icebatch.core.costs.estimate import estimate_run, pace, run_cost, spent_on
from icebatch.core.events import BatchJobFailed
from icebatch.core.ledger import Key, RunRecord
from icebatch.core.settings import Settings

from tests.support.consumers import triage

pytestmark = pytest.mark.unit
CONSUMER = triage()


def run(version: int = 1, *, rows: int = 1000, engine: float = 50, startup: float = 20, job: float = 70) -> RunRecord:
    props = {
        Key.ROWS: str(rows),
        Key.ENGINE_SECONDS: str(engine),
        Key.ENGINE_STARTUP_SECONDS: str(startup),
        Key.JOB_SECONDS: str(job),
        Key.GPUS: "1",
        Key.INPUT_TOKENS: str(rows * 300),
        Key.OUTPUT_TOKENS: str(rows * 60),
    }
    return RunRecord("r", 1, 0, None, 1, CONSUMER.task.name, version, props)


def test_without_runs_the_estimate_uses_the_documented_priors() -> None:
    # given a consumer with no run of its task version, on a deployment that sets its own start-up prior
    settings = Settings(startup_seconds_prior=60, gpu_hourly_rate=3.6)
    # when 1,200 rows are estimated, then: 1,200 rows at ICEBATCH_ROWS_PER_GPU_HOUR plus the prior, no idle tail
    # (the local backend pays none)
    e = estimate_run(1200, CONSUMER, [], settings)
    assert e.gpu_hours == pytest.approx(1200 / 120_000 + 60 / 3600)
    assert e.usd == pytest.approx(e.gpu_hours * 3.6) and "pace: priors" in e.basis


def test_without_runs_the_tokens_are_the_prompt_plus_the_configured_row_prior() -> None:
    # given a consumer with no run of its task version, on a deployment whose rows are long documents
    settings = Settings(row_tokens_prior=4000)
    task = CONSUMER.task
    prompt = (len(task.system_prompt) + len(task.user_template)) / 4
    # when 100 rows are estimated
    e = estimate_run(100, CONSUMER, [], settings)
    # then each row is its prompt plus the configured 4,000 tokens in, and the schema's bound out, and it says so
    assert e.input_tokens == round((prompt + 4000) * 100)
    assert e.output_tokens == task.max_tokens * 100
    assert "4000 tokens of row" in e.basis
    # and once the task version has runs, their measure replaces the prior
    measured = estimate_run(100, CONSUMER, [run()], settings)
    assert measured.input_tokens == 300 * 100 and "measured over the last 1 run(s)" in measured.basis


def test_the_pace_is_measured_from_the_consumers_last_runs() -> None:
    # given two runs of the task version: 1,000 rows streamed in 30 s after a 20 s engine start, 70 s in all
    runs = [run(), run(), run(version=2, rows=10, engine=500, startup=0, job=500)]  # another version's: ignored
    # when the pace is read, then 120,000 rows per GPU-hour and 40 s of fixed cost per run
    p = pace(CONSUMER, runs, Settings())
    assert (p.rows_per_gpu_hour, p.fixed_seconds) == (pytest.approx(120_000), pytest.approx(40))
    # and the estimate of 600 rows is what such a run costs: 18 s of streaming and the 40 s fixed part
    e = estimate_run(600, CONSUMER, runs, Settings(gpu_hourly_rate=3.6))
    assert e.gpu_hours == pytest.approx((18 + 40) / 3600) and "pace: 2 run(s)" in e.basis


def test_the_start_up_learned_from_runs_includes_what_came_before_their_jobs_process() -> None:
    # given two runs whose jobs measured 95 s from the launch to their process (the GPU node, the image, Ray)
    runs = [run(), run()]
    for r in runs:
        r.properties[Key.BEFORE_JOB_SECONDS] = "95.000"  # type: ignore[index]
    # then a launch's fixed part is that and the 40 s the job spent before and after streaming: 135 s
    assert pace(CONSUMER, runs, Settings()).fixed_seconds == pytest.approx(135)
    # and the run's cost bills the node for it (with its job and its idle tail)
    totals = runs[0].totals(Settings().billing())
    assert totals.before_job_seconds == 95
    kuberay = Settings(backend="kuberay", job_ttl_seconds=60, karpenter_consolidate_seconds=30)
    assert run_cost(totals, kuberay).gpu_lifetime_seconds == pytest.approx(95 + 70 + 90)


def test_the_idle_tail_is_estimated_only_on_the_backend_that_pays_it() -> None:
    local = estimate_run(100, CONSUMER, [run()], Settings())
    on_eks = estimate_run(100, CONSUMER, [run()], Settings(backend="kuberay"))
    tail = Settings().cluster.job_ttl_seconds + Settings().cluster.karpenter_consolidate_seconds
    assert on_eks.gpu_hours - local.gpu_hours == pytest.approx(tail / 3600)


def test_a_days_spend_counts_each_failed_attempt_once_and_only_those_that_committed_nothing() -> None:
    # given a day with no run, and failure events: a start that failed (120 s of a GPU at $3.60 an hour),
    # reported twice (by the job and by the nightly reconciliation), an attempt that had committed rows (its
    # time is in its run's figure), and a failure of the day before
    settings = Settings(gpu_hourly_rate=3.6)
    day = datetime(2026, 12, 7, 15, 0, tzinfo=UTC)

    def failed(at: datetime, committed: int = 0, run: str = "triage-a") -> BatchJobFailed:
        return BatchJobFailed(
            deployment="d",
            run_id=run,
            consumer="triage",
            task="t",
            task_version=1,
            source_table="s.t",
            reason="CUDA out of memory",
            error_type="OutOfMemoryError",
            stage="start",
            retryable=True,
            job_seconds=120,
            attempt_rows_committed=committed,
            failed_at=at,
        )

    failures = [failed(day), failed(day), failed(day, committed=40, run="triage-b"), failed(day - timedelta(days=1))]
    # when that day's spend is counted, then it is the one start that committed nothing, once
    assert spent_on(day, [], settings, failures) == pytest.approx(3.6 * 120 / 3600)
    # and without the failures, nothing
    assert spent_on(day, [], settings) == 0
