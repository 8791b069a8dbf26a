"""Event contracts between the launcher, the job and the reporter (EventBridge source ``icebatch``).

The JSON Schemas in ``eventbridge/schemas/`` are generated from these models
(``icebatch contracts write``) and a test keeps them in step. Readers are tolerant (unknown fields are
ignored) so that adding a field is a compatible change; removing or retyping one is not, and the schema
test catches it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, Strict, model_validator

from icebatch.core.costs.run_cost import CostBreakdown
from icebatch.core.untrusted import CONSUMER_NAME, DEPLOYMENT, RUN_ID

if TYPE_CHECKING:
    from icebatch.core.ledger import RunPlan, RunTotals

EVENT_SOURCE = "icebatch"
SCHEMA_VERSION = 1
# Strict: no coercion ("12" is not a count, 1 is not a boolean), finite numbers only. Times arrive as
# ISO 8601 text in JSON, so they alone are parsed.
STRICT = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)
Timestamp = Annotated[AwareDatetime, Strict(False)]
RunId = Annotated[str, Field(pattern=RUN_ID, max_length=100, description="The run (file-name safe)")]
ConsumerName = Annotated[str, Field(pattern=CONSUMER_NAME, max_length=20, description="The consumer")]
TableName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+\.[A-Za-z0-9_]+$", max_length=255)]
MAX_SHARED = 15  # consumers one job takes besides a run's own (``icebatch_job.shared``)
Name = Annotated[str, Field(max_length=255, pattern=r"^[^\x00-\x1f\x7f]*$")]  # no control characters


class _Detail(BaseModel):
    model_config = STRICT
    detail_type: ClassVar[str]
    schema_version: Literal[1] = Field(default=1, description="Bumped on incompatible changes")
    deployment: str = Field(
        default="local",
        max_length=64,
        pattern=DEPLOYMENT,
        description="The deployment (stack) that sent it: each deployment's rules take only its own events",
    )


class SnapshotRange(BaseModel):
    model_config = STRICT
    from_exclusive: int | None = Field(description="Watermark the run started from (None: beginning)")
    to_inclusive: int = Field(description="Last source snapshot included (the new watermark)")


class TokenCounts(BaseModel):
    model_config = STRICT
    input: int = Field(ge=0)
    output: int = Field(ge=0)

    @property
    def total(self) -> int:
        return self.input + self.output


class BatchJobSubmitted(_Detail):
    """The launcher created a job (RayJob or local)."""

    detail_type: ClassVar[str] = "Batch Job Submitted"
    job_name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    consumer: ConsumerName
    source_table: TableName
    range: SnapshotRange
    backlog_rows: int = Field(ge=0)
    gpus: int = Field(ge=0)
    backend: Literal["local", "kuberay"]
    trigger: Annotated[str, Field(max_length=32)]
    submitted_at: Timestamp


class BatchJobCompleted(_Detail):
    """A run committed its results and its new watermark."""

    detail_type: ClassVar[str] = "Batch Job Completed"
    run_id: RunId
    consumer: ConsumerName
    task: Name | None = Field(default=None, description="Task name of the consumer (null in older events)")
    task_version: int | None = Field(default=None, ge=1, description="Task version the rows were labelled with")
    source_table: TableName
    results_table: TableName
    range: SnapshotRange
    rows: int = Field(ge=0)
    row_noun: Annotated[str, Field(pattern=r"^[a-z][a-z -]{0,22}[a-z]$")] = Field(
        default="rows", description='What the consumer calls a source row in reports ("tickets"; "rows" by default)'
    )
    rows_ok: int = Field(ge=0)
    rows_error: int = Field(ge=0, description="invalid_output + inference_error rows (kept, not dropped)")
    rows_by_status: dict[Annotated[str, Field(max_length=32)], Annotated[int, Field(ge=0)]]
    rows_truncated: int = Field(default=0, ge=0)
    rows_unchanged: int = Field(
        default=0, ge=0, description="Rows rewritten with content that already had a verdict: not sent again"
    )
    verdicts_removed: int = Field(
        default=0,
        ge=0,
        description="Verdicts this run removed: of rows deleted from the source, and superseded "
        "by its own (the row changed)",
    )
    labels: dict[str, dict[str, int]] = Field(description="Label breakdown per enum output field")
    tokens: TokenCounts
    engine_seconds: float = Field(ge=0, description="Wall time of the streaming LLM stage (GPU held)")
    first_result_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Part of engine_seconds before the first result: mostly engine start-up",
    )
    engine_startup_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Part of engine_seconds before the first token: the first result's arrival less the engine "
        "time of its batch (null in events from before it was measured)",
    )
    engine_weights_seconds: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Part of the start-up loading the model's checkpoint, as vLLM timed it (null: not measured, "
        "as with the run:ai streamer)",
    )
    engine_warmup_seconds: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Part of the start-up profiling memory, allocating the KV cache and warming the model up, as "
        "vLLM timed it (null: not measured)",
    )
    job_seconds: float = Field(ge=0)
    device: Annotated[str, Field(max_length=32)]
    model: Annotated[str, Field(max_length=1024)]
    cost: CostBreakdown
    results_location: Annotated[str, Field(max_length=300)] = Field(description="`<table>@<ledger snapshot id>`")
    ledger_snapshot_id: int
    rayjob_name: Name | None = None
    attempts: int = Field(default=1, ge=1, description="Attempts the run took (job_seconds and cost cover them all)")
    chunks: int = Field(default=1, ge=1, description="Commits the run's rows were cut into")
    rows_redone: int = Field(
        default=0,
        ge=0,
        description="Rows inferred again because another attempt had committed them first (an attempt killed "
        "without notice also loses what it had not committed: at most one chunk)",
    )
    warm: bool = Field(
        default=False,
        description="Taken by a job that lingered after another run: its node, Ray and weights were up (no cluster "
        "tail of its own; job_seconds include the wait before it)",
    )
    linger_seconds: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="The job's last idle window after this run, paid by it (part of cost.idle_tail_seconds)",
    )
    before_job_seconds: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="From the launch to the job's process: the GPU node, the image pull, the Ray cluster's start "
        "(every attempt's; billed in cost.gpu_lifetime_seconds; 0: not measured, e.g. a job run by hand)",
    )
    before_job_node_seconds: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Of before_job_seconds, the launch to the boot of the GPU node the engine ran on (0: it was up "
        "already; null: not measured)",
    )
    before_job_image_seconds: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Of before_job_seconds, that node's boot to its container's start: the node joining the cluster "
        "and the job image's pull (null: not measured); the rest is the Ray cluster's start",
    )
    shared_with: list[ConsumerName] = Field(
        default_factory=list,
        max_length=MAX_SHARED,
        description="The other consumers whose runs the same job took through the same engine (cost.share is the "
        "part of the node this run paid, by tokens; cost.sharing_saved what the others paid for it)",
    )
    started_at: Timestamp
    finished_at: Timestamp

    @model_validator(mode="after")
    def _consistent(self) -> BatchJobCompleted:
        if self.rows_ok + self.rows_error > self.rows:
            raise ValueError(f"rows_ok ({self.rows_ok}) + rows_error ({self.rows_error}) exceed rows ({self.rows})")
        if self.rows_by_status and sum(self.rows_by_status.values()) != self.rows:
            raise ValueError(f"rows_by_status adds up to {sum(self.rows_by_status.values())}, not rows ({self.rows})")
        if self.rows_truncated > self.rows or self.rows_redone > self.rows:
            raise ValueError(f"rows_truncated/rows_redone exceed rows ({self.rows})")
        if self.finished_at < self.started_at:
            raise ValueError("finished_at is before started_at")
        return self


class BatchJobFailed(_Detail):
    """An attempt ended before the run's last commit (or a job died without saying so: found by reconciliation)."""

    detail_type: ClassVar[str] = "Batch Job Failed"
    run_id: RunId | None = None
    consumer: ConsumerName
    task: Name | None = None
    task_version: int | None = Field(default=None, ge=1)
    source_table: TableName
    range: SnapshotRange | None = None
    reason: str = Field(description="What went wrong (reports cut it to their channel's limits)")
    error_type: Annotated[str, Field(max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")]
    stage: Literal["plan", "start", "inference", "write", "commit", "cluster", "unknown"] = "unknown"
    retryable: bool = Field(description="The range stays pending; the next trigger processes it again")
    origin: Literal["job", "reconciler"] = "job"
    rows_processed: int = Field(default=0, ge=0, description="Result rows this attempt produced")
    rows_committed: int = Field(
        default=0, ge=0, description="Rows of the range committed so far (earlier attempts' and this one's)"
    )
    attempt_rows_committed: int = Field(
        default=0, ge=0, description="Rows this attempt committed (0: its GPU time is in no completed run's cost)"
    )
    resumable: bool = Field(
        default=False,
        description="Committed rows stay committed: the next attempt of the run continues after them",
    )
    attempt: int | None = Field(default=None, ge=1)
    tokens: TokenCounts | None = None
    engine_seconds: float = Field(default=0.0, ge=0)
    job_seconds: float | None = None
    cost: CostBreakdown | None = None
    rayjob_name: Name | None = None
    started_at: Timestamp | None = None
    failed_at: Timestamp


class BatchJobDeferred(_Detail):
    """A run given no model (rows deleted or rewritten, none added) found rows whose content changed: it committed
    nothing, and the launcher launches the range's next attempt, with the model, as soon as this arrives."""

    detail_type: ClassVar[str] = "Batch Job Deferred"
    run_id: RunId
    consumer: ConsumerName
    source_table: TableName
    range: SnapshotRange
    rows_for_the_model: int = Field(ge=0, description="Rows of the range whose content changed")
    rayjob_name: Name | None = Field(default=None, description="The job that deferred (it has ended)")
    deferred_at: Timestamp


DETAIL_MODELS: dict[str, type[_Detail]] = {
    m.detail_type: m for m in (BatchJobSubmitted, BatchJobCompleted, BatchJobFailed, BatchJobDeferred)
}


def envelope(
    detail: _Detail, *, event_id: str, time: datetime, region: str = "local", account: str = "000000000000"
) -> dict[str, Any]:
    """The EventBridge event that carries ``detail`` (what a rule target receives)."""
    return {
        "version": "0",
        "id": event_id,
        "detail-type": detail.detail_type,
        "source": EVENT_SOURCE,
        "account": account,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [],
        "detail": detail.model_dump(mode="json"),
    }


def _day(seconds: float | None) -> float | None:
    return None if seconds is None else min(seconds, 86_400)


def completed_event(
    plan: RunPlan,
    totals: RunTotals,
    *,
    deployment: str,
    rows_by_status: dict[str, int],
    labels: dict[str, dict[str, int]],
    cost: CostBreakdown,
    ledger_snapshot_id: int,
    finished_at: datetime,
    chunks: int = 1,
    row_noun: str = "rows",
    rows_unchanged: int = 0,
    verdicts_removed: int = 0,
) -> BatchJobCompleted:
    """The one way a "Batch Job Completed" is made: by the job at its commit, and rebuilt from the ledger."""
    started = datetime.fromisoformat(totals.started_at) if totals.started_at else finished_at
    return BatchJobCompleted(
        deployment=deployment,
        run_id=plan.run_id,
        consumer=plan.consumer,
        task=plan.task,
        task_version=plan.task_version,
        source_table=plan.source_table,
        results_table=plan.results_table,
        range=SnapshotRange(from_exclusive=plan.from_snapshot_exclusive, to_inclusive=plan.to_snapshot_inclusive),
        rows=totals.rows,
        row_noun=row_noun,
        rows_ok=totals.rows_ok,
        rows_error=totals.rows_error,
        rows_by_status=rows_by_status,
        rows_truncated=totals.rows_truncated,
        rows_unchanged=rows_unchanged,
        verdicts_removed=verdicts_removed,
        labels=labels,
        tokens=TokenCounts(input=totals.input_tokens, output=totals.output_tokens),
        engine_seconds=totals.engine_seconds,
        first_result_seconds=totals.first_result_seconds,
        engine_startup_seconds=totals.engine_startup_seconds,
        engine_weights_seconds=_day(totals.engine_weights_seconds),
        engine_warmup_seconds=_day(totals.engine_warmup_seconds),
        job_seconds=totals.job_seconds,
        device=totals.device,
        model=totals.model,
        cost=cost,
        results_location=f"{plan.results_table}@{ledger_snapshot_id}",
        ledger_snapshot_id=ledger_snapshot_id,
        rayjob_name=totals.rayjob_name or None,
        attempts=totals.attempts,
        chunks=chunks,
        rows_redone=totals.rows_redone,
        warm=totals.warm,
        linger_seconds=totals.linger_seconds,
        shared_with=list(totals.shared_with),
        before_job_seconds=min(totals.before_job_seconds, 86_400),
        before_job_node_seconds=_day(totals.before_job_node_seconds),
        before_job_image_seconds=_day(totals.before_job_image_seconds),
        started_at=started,
        finished_at=finished_at,
    )
