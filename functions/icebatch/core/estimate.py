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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from icebatch.core.consumers import Consumer
from icebatch.core.costs import CostBreakdown, CostInputs, cost_breakdown
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
    fixed = [max(0.0, r.number(Key.JOB_SECONDS) - s) for s, r in zip(streaming, done, strict=True)]
    return Pace(sum(fixed) / len(fixed), sum(r.number(Key.ROWS) for r in done) / gpu_hours, f"{len(done)} run(s)")


def estimate_run(rows: int, consumer: Consumer, runs: Sequence[RunRecord], settings: Settings) -> Estimate:
    billing = settings.billing()
    tin, tout, basis = tokens_per_row(consumer, runs, settings.launch.row_tokens_prior)
    gpus = gpus_for(rows, consumer, settings)
    tail = (
        settings.cluster.job_ttl_seconds + settings.cluster.karpenter_consolidate_seconds
        if settings.top.backend == "kuberay"
        else 0
    )
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
    )


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
        )
    )


def spent_on(day: datetime, runs: Sequence[RunRecord], settings: Settings) -> float:
    """What the runs committed on ``day`` (UTC) cost, GPU lifetime included (the reports' figure)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000
    billing = settings.billing()
    return sum(
        run_cost(run.totals(billing), settings).lifetime_cost
        for run in runs
        if not run.is_reset and start <= run.committed_at_ms < start + 86_400_000
    )
