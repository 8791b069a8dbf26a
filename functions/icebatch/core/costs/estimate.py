"""What a run will cost, before it runs: the launcher's budget check and ``icebatch estimate``.

From metadata and the ledger only (the launcher never reads data files):

- **rows**: the backlog (or a backfill's whole range);
- **tokens per row**: measured by the consumer's last committed runs of the same task version; without
  such history, a prior from the task: its prompt at ~4 characters a token plus ``ICEBATCH_ROW_TOKENS_PRIOR``
  of the row's columns in, ``max_tokens`` out (the schema's bound: an upper estimate);
- **GPU-hours**: rows at the consumer's measured throughput per GPU (its last runs of the task version:
  rows over the engine's streaming time after its start-up), plus each GPU's fixed share — the measured
  start-up and commit time of a run (its lifetime less the streaming) — and, on the kuberay backend, the
  idle tail (``ttlSecondsAfterFinished`` + ``consolidateAfter``), as ``run_cost`` bills them. Without
  history: ``ICEBATCH_ROWS_PER_GPU_HOUR`` and ``ICEBATCH_STARTUP_SECONDS_PRIOR``;
- **$**: GPU-hours at the billing rate (``Settings.billing``).

Whether a run pays (``CostCheck``, the launcher's cost gate): its $ per 1k rows, start-up and idle tail included,
against the consumer's ceiling -- its ``max_usd_per_1k_rows``, else its ``cost_reference``: what the same tokens cost
at a batch API (``icebatch.core.costs.prices``) -- and how many rows in all make a run pay: a run's cost is a fixed
part (start-up, idle tail) plus a part per row, so its price per row falls as it grows, towards the part per row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from icebatch.core.consumers import Consumer
from icebatch.core.costs.money import usd
from icebatch.core.costs.prices import BatchPrice
from icebatch.core.costs.run_cost import CostBreakdown, CostInputs, cost_breakdown
from icebatch.core.events import BatchJobFailed
from icebatch.core.ledger.summary import Key, RunRecord, RunTotals
from icebatch.core.settings import Settings

CHARS_PER_TOKEN = 4
HISTORY_RUNS = 5


@dataclass(frozen=True)
class Estimate:
    consumer: str
    task_version: int
    rows: int
    input_tokens: int
    output_tokens: int
    gpus: int
    gpu_hours: float
    usd: float
    usd_per_hour: float
    instance_type: str | None
    basis: str  # where the tokens per row come from
    fixed_usd: float = 0.0  # of ``usd``, what the run pays whatever its rows: start-up and idle tail per GPU
    startup_seconds: float = 0.0  # from launch to the first answer: the measured start-up (or the prior)
    first_commit_seconds: float = 0.0  # from launch to the first chunk's commit: start-up and a chunk's rows

    def to_dict(self) -> dict[str, object]:
        return {
            "consumer": self.consumer,
            "task_version": self.task_version,
            "rows": self.rows,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "gpus": self.gpus,
            "gpu_hours": round(self.gpu_hours, 4),
            "usd": round(self.usd, 4),
            "usd_per_hour": self.usd_per_hour,
            "instance_type": self.instance_type,
            "basis": self.basis,
        }

    @property
    def usd_per_1k_rows(self) -> float | None:
        return self.usd / self.rows * 1000 if self.rows else None


def gpus_for(rows: int, consumer: Consumer, settings: Settings) -> int:
    """GPUs needed to drain ``rows`` in about ``target_job_hours``, within [1, the consumer's max_gpus]."""
    per_gpu = settings.launch.rows_per_gpu_hour * settings.launch.target_job_hours
    return max(1, min(consumer.max_gpus, math.ceil(rows / per_gpu)))


def tokens_per_row(consumer: Consumer, runs: Sequence[RunRecord], row_prior: int) -> tuple[float, float, str]:
    """(input, output) tokens per row, and the basis: measured history, else the task's prompt plus ``row_prior``
    tokens of the row's columns in and ``max_tokens`` out."""
    done = [r for r in runs if r.task_version == consumer.task_version and not r.is_reset and r.number(Key.ROWS) > 0][
        :HISTORY_RUNS
    ]
    rows = sum(r.number(Key.ROWS) for r in done)
    if rows:
        tin = sum(r.number(Key.INPUT_TOKENS) for r in done) / rows
        tout = sum(r.number(Key.OUTPUT_TOKENS) for r in done) / rows
        return tin, tout, f"measured over the last {len(done)} run(s), {int(rows):,} rows"
    task = consumer.task
    prompt = (len(task.system_prompt) + len(task.user_template)) / CHARS_PER_TOKEN
    basis = f"task prior (no run of this task version yet: its prompt + {row_prior} tokens of row, max_tokens out)"
    return prompt + row_prior, float(task.max_tokens), basis


@dataclass(frozen=True)
class Pace:
    """How fast a consumer's runs go: fixed seconds per run (start-up, commits) and rows per GPU-hour."""

    fixed_seconds: float
    rows_per_gpu_hour: float
    basis: str


def pace(consumer: Consumer, runs: Sequence[RunRecord], settings: Settings) -> Pace:
    """Measured by the consumer's last runs of the same task version, else the deployment's priors."""
    done = [
        r
        for r in runs
        if r.task_version == consumer.task_version
        and not r.is_reset
        and r.number(Key.ROWS) > 0
        and r.number(Key.ENGINE_SECONDS) > r.number(Key.ENGINE_STARTUP_SECONDS)
    ][:HISTORY_RUNS]
    if not done:
        return Pace(float(settings.launch.startup_seconds_prior), float(settings.launch.rows_per_gpu_hour), "priors")
    streaming = [r.number(Key.ENGINE_SECONDS) - r.number(Key.ENGINE_STARTUP_SECONDS) for r in done]
    gpu_hours = sum(s * max(1, int(r.number(Key.GPUS, 1))) for s, r in zip(streaming, done, strict=True)) / 3600
    # a cold start is what a launch pays: runs a lingering job took warm measure the pace, not the start-up
    # and what came before the job's process (the GPU node, the image, the Ray cluster), where the job measured it
    fixed = [
        max(0.0, r.number(Key.JOB_SECONDS) - s) + r.number(Key.BEFORE_JOB_SECONDS)
        for s, r in zip(streaming, done, strict=True)
        if not r.warm
    ]
    startup = sum(fixed) / len(fixed) if fixed else float(settings.launch.startup_seconds_prior)
    return Pace(startup, sum(r.number(Key.ROWS) for r in done) / gpu_hours, f"{len(done)} run(s)")


def estimate_run(rows: int, consumer: Consumer, runs: Sequence[RunRecord], settings: Settings) -> Estimate:
    billing = settings.billing()
    tin, tout, basis = tokens_per_row(consumer, runs, settings.launch.row_tokens_prior)
    gpus = gpus_for(rows, consumer, settings)
    tail = idle_tail_seconds(settings)
    speed = pace(consumer, runs, settings)
    engine_hours = rows / speed.rows_per_gpu_hour
    gpu_hours = engine_hours + gpus * (speed.fixed_seconds + tail) / 3600 if rows else 0.0
    pace_text = f"{speed.fixed_seconds:.0f} s fixed, {speed.rows_per_gpu_hour:,.0f} rows/GPU-h"
    basis = f"{basis}; pace: {speed.basis} ({pace_text})"
    return Estimate(
        consumer=consumer.name,
        task_version=consumer.task_version,
        rows=rows,
        input_tokens=round(tin * rows),
        output_tokens=round(tout * rows),
        gpus=gpus,
        gpu_hours=gpu_hours,
        usd=gpu_hours * billing.usd_per_hour,
        usd_per_hour=billing.usd_per_hour,
        instance_type=billing.instance_type,
        basis=basis,
        fixed_usd=gpus * (speed.fixed_seconds + tail) / 3600 * billing.usd_per_hour if rows else 0.0,
        startup_seconds=speed.fixed_seconds,
        first_commit_seconds=speed.fixed_seconds
        + min(rows, settings.progress.chunk_rows) / speed.rows_per_gpu_hour * 3600,
    )


def idle_tail_seconds(settings: Settings) -> int:
    """What a job's GPU node lives on after it ends: the RayJob's TTL and Karpenter's consolidation (kuberay only)."""
    c = settings.cluster
    return c.job_ttl_seconds + c.karpenter_consolidate_seconds if settings.top.backend == "kuberay" else 0


def run_cost(totals: RunTotals, settings: Settings) -> CostBreakdown:
    """What a run cost: its engine time, and the GPU lifetime of all its attempts with their idle tails.

    The hourly rate is the one the run recorded (the deployment's when it recorded none); the idle tail
    (RayJob TTL, Karpenter consolidation) is paid only on the kuberay backend.
    """
    billing = totals.billing or settings.billing()
    tail = settings.top.backend == "kuberay"
    return cost_breakdown(
        CostInputs(
            rows=totals.rows,
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            engine_seconds=totals.engine_seconds,
            job_seconds=totals.job_seconds,
            attempts=max(1, totals.attempts),
            gpus=totals.gpus,
            hourly_rate=billing.usd_per_hour,
            instance_type=billing.instance_type,
            rate_source=billing.source,
            ttl_seconds=settings.cluster.job_ttl_seconds if tail else 0,
            consolidate_seconds=settings.cluster.karpenter_consolidate_seconds if tail else 0,
            warm=totals.warm,
            linger_seconds=totals.linger_seconds,
            share=totals.share,
            before_job_seconds=totals.before_job_seconds,
            # what a shared job splits: its time before the engine streamed, and the engine's start-up
            startup_seconds=totals.before_job_seconds
            + max(0.0, totals.job_seconds - totals.engine_seconds)
            + (totals.engine_startup_seconds or 0),
        )
    )


def spent_on(
    day: datetime, runs: Sequence[RunRecord], settings: Settings, failures: Iterable[BatchJobFailed] = ()
) -> float:
    """What was spent on ``day`` (UTC), as ``icebatch costs`` counts it (the figure ``max_usd_per_day`` is held to):
    the runs committed that day, GPU lifetime included (the reports' figure), and the attempts that failed that day
    having committed nothing (``failures``: their time is in no run's figure; an attempt that committed chunks is
    in its run's figure up to its last commit). The same failure reported twice (by the job and by the nightly
    reconciliation, or found in both records) is one attempt: its consumer, run and time."""
    start = start_of(day).timestamp() * 1000
    billing = settings.billing()
    committed = sum(
        run_cost(run.totals(billing), settings).lifetime_cost
        for run in runs
        if not run.is_reset and start <= run.committed_at_ms < start + 86_400_000
    )
    failed = {
        (f.consumer, f.run_id, f.failed_at): attempt_cost(f, settings)
        for f in failures
        if not f.attempt_rows_committed and start <= f.failed_at.timestamp() * 1000 < start + 86_400_000
    }
    return committed + sum(failed.values())


def start_of(day: datetime) -> datetime:
    """The start of ``day``'s UTC day: what a day's spend is counted from."""
    day = day.astimezone(UTC)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def attempt_cost(failure: BatchJobFailed, settings: Settings) -> float:
    """What a failed attempt's own lifetime cost (its event's cost is the run's so far, earlier attempts included),
    with its node's idle tail on kuberay, as ``run_cost`` bills each attempt of a run."""
    cost = failure.cost
    rate = cost.hourly_rate * max(1, cost.gpus) if cost else settings.billing().usd_per_hour
    c = settings.cluster
    tail = c.job_ttl_seconds + c.karpenter_consolidate_seconds if settings.top.backend == "kuberay" else 0
    return rate * ((failure.job_seconds or 0.0) + tail) / 3600


@dataclass(frozen=True)
class Ceiling:
    """What a run may cost per 1k rows, and where that figure comes from."""

    usd_per_1k_rows: float
    basis: str  # "max_usd_per_1k_rows" or "<provider:model> for the same tokens"


def reference_price(consumer: Consumer, settings: Settings, input_tokens: int, output_tokens: int) -> BatchPrice | None:
    """The batch API the consumer's runs are compared with (``cost_reference``): the one it names, or for
    ``cheapest`` the deployment's cheapest for these tokens; None for ``off`` or a deployment with no prices."""
    prices = settings.cost.batch_prices()
    if consumer.cost_reference == "off" or not prices:
        return None
    if consumer.cost_reference == "cheapest":
        return min(prices, key=lambda p: p.cost(input_tokens, output_tokens))
    return next((p for p in prices if p.name == consumer.cost_reference), None)


def ceiling(consumer: Consumer, estimate: Estimate, settings: Settings) -> Ceiling | None:
    """The consumer's ceiling for a run of ``estimate``'s tokens per row (None: no cost gate)."""
    if consumer.max_usd_per_1k_rows is not None:
        return Ceiling(consumer.max_usd_per_1k_rows, "max_usd_per_1k_rows")
    price = reference_price(consumer, settings, estimate.input_tokens, estimate.output_tokens)
    if price is None or not estimate.rows:
        return None
    per_1k = price.cost(estimate.input_tokens, estimate.output_tokens) / estimate.rows * 1000
    return Ceiling(per_1k, f"{price.name} for the same tokens") if per_1k > 0 else None


@dataclass(frozen=True)
class CostCheck:
    """A run's price per 1k rows beside the consumer's ceiling (the launcher's cost gate)."""

    usd_per_1k_rows: float
    ceiling: Ceiling
    rows: int
    rows_to_pay: int | None  # the fewest rows in all whose run costs at most the ceiling (None: no run does)
    usd_per_1k_rows_at_scale: float  # the price per 1k rows a very large run tends to: generation alone

    @property
    def pays(self) -> bool:
        return self.usd_per_1k_rows <= self.ceiling.usd_per_1k_rows

    def summary(self) -> str:
        """One line: what the run costs per 1k rows against the ceiling, and what would make it pay."""
        c = self.ceiling
        head = f"{usd(self.usd_per_1k_rows)} per 1k rows (start-up and idle tail included)"
        against = f"ceiling {usd(c.usd_per_1k_rows)} ({c.basis})"
        if self.pays:
            return f"{head} <= {against}: it pays"
        if self.rows_to_pay is None:
            at_scale = usd(self.usd_per_1k_rows_at_scale)
            return f"{head} > {against}: no run pays, generation alone costs {at_scale} per 1k rows at this pace"
        return f"{head} > {against}: {self.rows_to_pay - self.rows:,} more rows make it pay"

    def to_dict(self) -> dict[str, object]:
        return {
            "usd_per_1k_rows": round(self.usd_per_1k_rows, 6),
            "ceiling_usd_per_1k_rows": round(self.ceiling.usd_per_1k_rows, 6),
            "ceiling_basis": self.ceiling.basis,
            "pays": self.pays,
            "rows_to_pay": self.rows_to_pay,
        }


def cost_check(rows: int, consumer: Consumer, runs: Sequence[RunRecord], settings: Settings) -> CostCheck | None:
    """Whether a run of ``rows`` pays against the consumer's ceiling (None: the consumer has none, or no rows)."""
    if rows <= 0:
        return None
    here = estimate_run(rows, consumer, runs, settings)
    limit = ceiling(consumer, here, settings)
    if limit is None or here.usd_per_1k_rows is None:
        return None
    per_row = _usd_per_row_at_scale(consumer, runs, settings)
    return CostCheck(
        here.usd_per_1k_rows, limit, rows, _rows_to_pay(rows, consumer, runs, settings, limit), per_row * 1000
    )


def _usd_per_row_at_scale(consumer: Consumer, runs: Sequence[RunRecord], settings: Settings) -> float:
    return settings.billing().usd_per_hour / pace(consumer, runs, settings).rows_per_gpu_hour


def _rows_to_pay(
    rows: int, consumer: Consumer, runs: Sequence[RunRecord], settings: Settings, limit: Ceiling
) -> int | None:
    """The fewest rows (at least ``rows``) whose run's estimate is at most ``limit`` per 1k rows, by bisection over
    the estimate itself (its GPUs grow with rows); None when not even 10^9 rows pay."""

    def pays(n: int) -> bool:
        per_1k = estimate_run(n, consumer, runs, settings).usd_per_1k_rows
        return per_1k is not None and per_1k <= limit.usd_per_1k_rows

    if pays(rows):
        return rows
    low, high = rows, max(rows * 2, 2)
    while not pays(high):
        if high >= 10**9:
            return None
        low, high = high, min(high * 4, 10**9)
    while high - low > 1:  # pays(high), not pays(low)
        middle = (low + high) // 2
        low, high = (low, middle) if pays(middle) else (middle, high)
    return high
