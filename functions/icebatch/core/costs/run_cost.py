"""What a run cost, honestly: the engine's time and the GPU lifetime the run caused.

The seed billed only the inference loop. A GPU node lives longer than that: it is provisioned before the
job starts, the job loads the model, and after the job the RayJob's cluster lingers for
``ttlSecondsAfterFinished`` and Karpenter waits ``consolidateAfter`` before removing the empty node.
icebatch reports both figures; per-row and per-token prices use the lifetime figure. A run that took
several attempts (a spot interruption, a crash) pays for every attempt's lifetime and idle tail. A job that
lingers (``icebatch_job.linger``): a run it takes warm pays its time from the commit before it and no cluster tail
(the job's first run pays that); the job's last idle window is paid, as idle tail, by the run that first kept the
node. A shared job (``icebatch_job.shared``: several consumers' runs through one engine) splits its node's lifetime
and tail among its runs by tokens: each pays its ``share``, and what it saved is the rest of the start-up and tail it
would have paid alone.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CostInputs(BaseModel):
    model_config = ConfigDict(frozen=True)

    rows: int = Field(ge=0)
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    engine_seconds: float = Field(ge=0, description="Wall time of the streaming LLM stage")
    job_seconds: float = Field(
        ge=0, description="Job start to end (model load, read, write, commit), summed over the run's attempts"
    )
    attempts: int = Field(default=1, ge=1, description="Attempts the run took (each one pays the idle tail)")
    gpus: int = Field(ge=0, description="Accelerators held by the job (engine replicas)")
    hourly_rate: float = Field(ge=0, description="$ per GPU-hour")
    ttl_seconds: float = Field(default=0, ge=0, description="RayJob ttlSecondsAfterFinished")
    consolidate_seconds: float = Field(default=0, ge=0, description="Karpenter consolidateAfter")
    warm: bool = Field(
        default=False, description="Its first attempt was taken by a lingering job, whose own tail another run paid"
    )
    linger_seconds: float = Field(default=0, ge=0, description="The job's last idle window, which no run follows")
    share: float = Field(
        default=1.0, gt=0, le=1, description="The part of its job's node the run pays (a shared job's runs: by tokens)"
    )
    before_job_seconds: float = Field(
        default=0, ge=0, description="From the launch to the job's process (GPU node, image pull, Ray cluster)"
    )
    startup_seconds: float = Field(default=0, ge=0, description="The job's start-up (what sharing splits)")
    instance_type: str | None = Field(default=None, description="Instance type the rate assumes")
    rate_source: str | None = Field(default=None, description="Where the rate comes from")


class CostBreakdown(BaseModel):
    """All money figures in USD."""

    # strict: a report's figures are numbers, finite and not negative (a string or `inf` is a broken event)
    model_config = ConfigDict(frozen=True, strict=True, allow_inf_nan=False)

    hourly_rate: float = Field(ge=0)
    gpus: int = Field(ge=0, le=10_000)
    engine_gpu_seconds: float = Field(ge=0)
    gpu_lifetime_seconds: float = Field(ge=0)
    idle_tail_seconds: float = Field(ge=0)
    engine_cost: float = Field(ge=0)
    lifetime_cost: float = Field(ge=0)
    usd_per_1k_rows: float | None = Field(ge=0)
    usd_per_1m_output_tokens: float | None = Field(ge=0)
    usd_per_1m_tokens: float | None = Field(ge=0)
    output_tokens_per_second: float | None = Field(ge=0)
    instance_type: str | None = Field(
        default=None, max_length=64, description="GPU instance type the hourly rate assumes (null: not recorded)"
    )
    rate_source: str | None = Field(
        default=None,
        max_length=200,
        description="Where the hourly rate comes from: an instance type's on-demand price, or a configured rate",
    )
    share: float = Field(default=1.0, gt=0, le=1, description="The part of a shared job's node this run paid")
    sharing_saved: float = Field(
        default=0.0, ge=0, description="The start-up and idle tail a shared job's other runs paid for this one"
    )


def cost_breakdown(c: CostInputs) -> CostBreakdown:
    """Example::

    >>> b = cost_breakdown(CostInputs(rows=1000, input_tokens=200_000, output_tokens=40_000,
    ...     engine_seconds=30, job_seconds=90, gpus=1, hourly_rate=0.8048, ttl_seconds=60,
    ...     consolidate_seconds=30))
    >>> round(b.lifetime_cost, 4), round(b.usd_per_1k_rows, 4)
    (0.0402, 0.0402)
    """
    tail = (c.ttl_seconds + c.consolidate_seconds) * (c.attempts - 1 if c.warm else c.attempts) + c.linger_seconds
    engine_gpu_seconds = c.engine_seconds * c.gpus
    lifetime = (c.before_job_seconds + c.job_seconds + tail) * c.gpus * c.share
    rate_per_second = c.hourly_rate / 3600
    saved = (1 - c.share) * (min(c.startup_seconds, c.job_seconds) + tail) * c.gpus * rate_per_second
    lifetime_cost = lifetime * rate_per_second
    total_tokens = c.input_tokens + c.output_tokens
    return CostBreakdown(
        hourly_rate=c.hourly_rate,
        gpus=c.gpus,
        engine_gpu_seconds=engine_gpu_seconds,
        gpu_lifetime_seconds=lifetime,
        idle_tail_seconds=tail * c.gpus * c.share,
        engine_cost=engine_gpu_seconds * rate_per_second,
        lifetime_cost=lifetime_cost,
        usd_per_1k_rows=lifetime_cost / c.rows * 1000 if c.rows else None,
        usd_per_1m_output_tokens=lifetime_cost / c.output_tokens * 1e6 if c.output_tokens else None,
        usd_per_1m_tokens=lifetime_cost / total_tokens * 1e6 if total_tokens else None,
        output_tokens_per_second=c.output_tokens / c.engine_seconds if c.engine_seconds else None,
        instance_type=c.instance_type,
        rate_source=c.rate_source,
        share=c.share,
        sharing_saved=saved,
    )
