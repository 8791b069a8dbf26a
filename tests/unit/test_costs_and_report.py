from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from icebatch.core.costs.report import completed_text, failed_text, subject
from icebatch.core.costs.run_cost import CostInputs, cost_breakdown
from icebatch.core.events import BatchJobCompleted, BatchJobFailed, SnapshotRange, TokenCounts
from icebatch_job.commit.sharing import Sharing

pytestmark = pytest.mark.unit


def _costs(**kw):  # type: ignore[no-untyped-def]
    base = dict(
        rows=2200,
        input_tokens=330_000,
        output_tokens=66_000,
        engine_seconds=60,
        job_seconds=150,
        gpus=1,
        hourly_rate=0.8048,
        ttl_seconds=60,
        consolidate_seconds=30,
    )
    return cost_breakdown(CostInputs(**{**base, **kw}))


def test_lifetime_includes_the_idle_tail_and_scales_with_gpus() -> None:
    one = _costs()
    assert one.gpu_lifetime_seconds == 240 and one.idle_tail_seconds == 90
    assert one.engine_cost == pytest.approx(60 / 3600 * 0.8048)
    assert one.lifetime_cost == pytest.approx(240 / 3600 * 0.8048)
    assert one.usd_per_1k_rows == pytest.approx(one.lifetime_cost / 2.2)
    assert one.usd_per_1m_output_tokens == pytest.approx(one.lifetime_cost / 0.066)
    assert one.usd_per_1m_tokens == pytest.approx(one.lifetime_cost / 0.396)
    four = _costs(gpus=4)
    assert four.lifetime_cost == pytest.approx(4 * one.lifetime_cost)


def test_no_rows_no_division_by_zero() -> None:
    c = _costs(rows=0, input_tokens=0, output_tokens=0, engine_seconds=0)
    assert (c.usd_per_1k_rows, c.usd_per_1m_tokens, c.output_tokens_per_second) == (None, None, None)


def _completed(**changes: Any) -> BatchJobCompleted:
    now = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    return BatchJobCompleted(
        run_id="triage-1",
        consumer="triage",
        source_table="support.tickets",
        results_table="support.tickets_triage_results",
        range=SnapshotRange(from_exclusive=1, to_inclusive=9),
        rows=2200,
        rows_ok=2190,
        rows_error=10,
        rows_by_status={"ok": 2190, "invalid_output": 10},
        labels={"sentiment": {"negative": 1200, "neutral": 990}},
        tokens=TokenCounts(input=330_000, output=66_000),
        engine_seconds=60,
        first_result_seconds=20,
        job_seconds=150,
        device="gpu",
        model="llama",
        cost=_costs(),
        results_location="support.tickets_triage_results@42",
        ledger_snapshot_id=42,
        started_at=now,
        finished_at=now,
    ).model_copy(update=changes)


def test_report_has_the_seed_blocks_and_honest_cost() -> None:
    text = completed_text(_completed())
    for block in ("INCREMENTAL STATE", "BATCH SUMMARY", "TOKENOMICS"):
        assert block in text
    assert "new rows              : 2200" in text  # an event that names no noun: "rows" (older events too)
    assert "GPU lifetime" in text and "idle tail 90.0 s" in text
    assert "60.0 s (first result after 20.0 s)" in text  # an event from before start-up was measured
    assert subject(_completed()) == "icebatch triage: 2,200 rows, $0.0537 (10 not ok)"


def test_the_report_and_subject_use_the_consumers_word_for_a_row() -> None:
    # given a run of a consumer whose rows are tickets
    event = _completed(row_noun="tickets")
    # then the report and the SNS subject say tickets, and nothing else does
    assert "new tickets           : 2200" in completed_text(event)
    assert subject(event) == "icebatch triage: 2,200 tickets, $0.0537 (10 not ok)"
    assert "ticket" not in completed_text(
        _completed(source_table="shop.reviews", results_table="shop.r_results", results_location="shop.r_results@42")
    )


def test_generation_rate_counts_every_token_from_the_first_one() -> None:
    # given a run whose first result came 20 s in, after its batch spent 8 s in the engine
    run = _completed(engine_seconds=60, first_result_seconds=20, engine_startup_seconds=12)
    # when the report is rendered
    text = completed_text(run)
    # then start-up ends at the first token and all 66,000 tokens count over the 48 s that followed
    assert "start-up 12.0 s, then 48.0 s generating at 1,375 output tok/s" in text


def test_the_start_up_says_what_vllm_spent_loading_the_weights_and_warming_up_where_it_said_so() -> None:
    # given a run whose engine said it loaded the checkpoint in 3.2 s and warmed up in 5.1 s, and one whose weights
    # were streamed (vLLM says nothing of them)
    both = _completed(
        engine_seconds=60,
        first_result_seconds=20,
        engine_startup_seconds=12,
        engine_weights_seconds=3.2,
        engine_warmup_seconds=5.1,
    )
    streamed = _completed(
        engine_seconds=60, first_result_seconds=20, engine_startup_seconds=12, engine_warmup_seconds=5.1
    )
    # then the report splits the start-up as far as it was measured
    assert "start-up 12.0 s: weights 3.2 s, warm-up 5.1 s, then 48.0 s generating" in completed_text(both)
    assert "start-up 12.0 s: warm-up 5.1 s, then 48.0 s generating" in completed_text(streamed)


def test_failure_report_says_what_happens_next() -> None:
    e = BatchJobFailed(
        consumer="triage",
        source_table="support.tickets",
        reason="OOM",
        error_type="OutOfMemoryError",
        stage="inference",
        retryable=True,
        failed_at=datetime.now(UTC),
    )
    assert "range stays pending" in failed_text(e)
    assert subject(e) == "icebatch triage: FAILED (OutOfMemoryError) at inference"


def test_a_failure_after_some_chunks_reports_them_committed_not_discarded() -> None:
    # given an attempt stopped (a stall, a spot notice) after committing 17 rows of the first run's range
    e = BatchJobFailed(
        consumer="triage",
        source_table="support.tickets",
        range={"from_exclusive": None, "to_inclusive": 42},
        reason="stalled: no result for 21 s after the last one",
        error_type="JobStalled",
        stage="inference",
        retryable=True,
        resumable=True,
        rows_processed=17,
        rows_committed=17,
        failed_at=datetime.now(UTC),
    )
    # when the report is rendered, then it says what stays and what the next attempt does
    text = failed_text(e)
    assert "discarded" not in text and "nothing was committed" not in text
    assert "rows committed        : 17 of the range (they stay: no attempt redoes them)" in text
    assert "the next trigger resumes the run and processes the rest of it" in text
    assert "range                 : (none: first run) -> 42" in text


def test_the_report_names_the_instance_type_and_where_its_rate_comes_from() -> None:
    from icebatch.core.settings import Settings

    # given the defaults (no configured rate): the cheapest allowed type that hosts the worker
    billing = Settings().billing()
    costs = _costs(hourly_rate=billing.usd_per_hour, instance_type=billing.instance_type, rate_source=billing.source)
    text = completed_text(_completed(cost=costs))
    assert "hourly rate           : $0.8048 per GPU-hour (g6.xlarge on-demand (us-east-1))" in text
    assert costs.instance_type == "g6.xlarge"


# --- the same tokens at batch APIs ------------------------------------------------------------------
def test_the_report_prices_the_runs_tokens_at_each_batch_api_and_says_which_was_cheaper() -> None:
    from icebatch.core.costs.prices import parse_prices

    # given a run of 2M input and 1M output tokens that cost $1.00 of GPU lifetime, and two batch prices
    run = _completed(
        tokens=TokenCounts(input=2_000_000, output=1_000_000), cost=_costs().model_copy(update={"lifetime_cost": 1.0})
    )
    prices = parse_prices("openai-batch:gpt-4o-mini=0.075/0.30;anthropic-batch:claude-3-5-haiku=0.40/2.00")
    # when its report is written
    text = completed_text(run, prices=prices)
    # then each price has a line with what the tokens cost there and how the GPU run compares
    assert "at batch APIs         : openai-batch:gpt-4o-mini $0.4500: 2.2x cheaper than the GPU run" in text
    assert "                      : anthropic-batch:claude-3-5-haiku $2.8000: the GPU run was 2.8x cheaper" in text
    # and with none configured (`off`), no such line
    assert "batch APIs" not in completed_text(run, prices=parse_prices("off"))


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "gpt=1",
        "gpt=1/",
        "gpt=-1/2",
        "gpt=1e3/2",
        "gpt=1/2;",
        " gpt=1/2",
        "gpt=10000/1",
        "a b=1/2",
        ";".join(f"m{i}=1/1" for i in range(11)),
        "OFF",
    ],
)
def test_a_price_list_it_cannot_read_is_refused_with_the_form_it_takes(spec: str) -> None:
    from icebatch.core.costs.prices import parse_prices

    with pytest.raises(ValueError, match=r"provider:model=|at most 10"):
        parse_prices(spec)


def test_a_cpu_runs_cost_is_labelled_as_the_gpu_equivalent_it_is() -> None:
    # given the same run on a GPU and on CPU (the embedded default, billed at the GPU's rate)
    gpu, cpu = _completed(device="gpu"), _completed(device="cpu")
    # then only the CPU run's report and subject say its cost is a GPU-equivalent
    assert "GPU-equivalent" not in completed_text(gpu) and "GPU-equivalent" not in subject(gpu)
    assert f"{'priced as':<22}: the GPU-equivalent: this run ran on CPU" in completed_text(cpu)
    assert subject(cpu) == subject(gpu).replace(" (10 not ok)", " GPU-equivalent (10 not ok)") != subject(gpu)


@pytest.mark.parametrize(("backend", "tail"), [("local", 0), ("kuberay", 300 + 60)])
def test_a_failed_attempts_cost_bills_its_nodes_idle_tail_on_kuberay_as_runs_do(backend: str, tail: int) -> None:
    from icebatch.core.costs.estimate import attempt_cost
    from icebatch.core.settings import Settings

    # given a failed attempt of 60 s whose event recorded no rate (the deployment's applies), on each backend
    settings = Settings(backend=backend, job_ttl_seconds=300, karpenter_consolidate_seconds=60)
    attempt = BatchJobFailed(
        consumer="triage",
        source_table="support.tickets",
        reason="OOM",
        error_type="E",
        stage="inference",
        retryable=True,
        failed_at=datetime.now(UTC),
        job_seconds=60.0,
    )
    # when its own cost is figured, then it is its lifetime plus, on kuberay, the node's TTL and consolidation
    rate = settings.billing().usd_per_hour
    assert attempt_cost(attempt, settings) == pytest.approx(rate * (60 + tail) / 3600)


def test_the_json_report_holds_every_figure_the_text_report_shows() -> None:
    from icebatch.control.reporter import build_report
    from icebatch.core.costs.prices import DEFAULT_SPEC, parse_prices

    # given a completed run's report, its tokens priced at the default batch APIs
    report = build_report(_completed(row_noun="reviews"), event_id="e", prices=parse_prices(DEFAULT_SPEC))
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1] for line in report.text.splitlines() if " : " in line}
    data, cost = report.data, report.data["cost"]

    def money(x: float) -> str:
        return f"${x:,.4f}" if x < 1 else f"${x:,.2f}"

    # then each figure the text shows is the JSON's, at the text's rounding
    assert f"{data['rows']:,}" in lines["rows"] and "new reviews" in report.text
    assert lines["input tokens"].strip().startswith(f"{data['tokens']['input']:,} ")
    assert lines["output tokens"].strip().startswith(f"{data['tokens']['output']:,} ")
    assert f"{cost['engine_gpu_seconds'] / 3600:.4f}" in lines["GPU-hours (engine)"]
    for label, key in (
        ("hourly rate", "hourly_rate"),
        ("cost (engine only)", "engine_cost"),
        ("cost (GPU lifetime)", "lifetime_cost"),
        ("$ per 1k rows", "usd_per_1k_rows"),
        ("$ per 1M output tok", "usd_per_1m_output_tokens"),
        ("$ per 1M tokens", "usd_per_1m_tokens"),
    ):
        assert money(cost[key]) in lines[label], (label, cost[key], lines[label])
    # and each batch API's price in the text is the JSON's
    assert data["batch_api_usd"]
    for name, usd in data["batch_api_usd"].items():
        assert f"{name} {money(usd)}" in report.text, (name, usd)
    # and the subject's cost and rows are the JSON's
    assert f"{data['rows']:,} reviews" in report.subject and money(cost["lifetime_cost"]) in report.subject


def test_a_shared_jobs_runs_split_its_node_by_tokens_and_each_says_what_it_saved() -> None:
    # given a shared job's node: 300 s of job (90 s of it start-up) and a 90 s tail, split 70/30 by tokens
    sharing = Sharing(["triage", "privacy"])
    assert sharing.split("triage") == {"share": 0.5, "shared_with": ("privacy",)}  # no tokens yet: even
    sharing.received("triage", pa.table({"num_input_tokens": [600], "num_generated_tokens": [100]}))
    sharing.received("privacy", pa.table({"num_input_tokens": [250], "num_generated_tokens": [50]}))
    node = {"rows": 100, "input_tokens": 1, "output_tokens": 1, "engine_seconds": 210, "job_seconds": 300, "gpus": 1}
    rate = {"hourly_rate": 3.6, "ttl_seconds": 60, "consolidate_seconds": 30, "startup_seconds": 90}
    alone = cost_breakdown(CostInputs(**node, **rate))
    costs = {
        name: cost_breakdown(CostInputs(**node, **rate, share=sharing.split(name)["share"]))
        for name in ("triage", "privacy")
    }
    # then the runs pay the node's lifetime between them, and each saved the others' part of start-up and tail
    assert sharing.split("privacy")["share"] == pytest.approx(0.3)
    assert sum(c.lifetime_cost for c in costs.values()) == pytest.approx(alone.lifetime_cost) == 0.39
    assert costs["triage"].sharing_saved == pytest.approx(0.3 * (90 + 90) / 1000)
    assert costs["privacy"].sharing_saved == pytest.approx(0.7 * (90 + 90) / 1000)
    assert alone.sharing_saved == 0 and alone.share == 1
