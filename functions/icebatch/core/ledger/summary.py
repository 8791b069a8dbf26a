"""What a ledger commit records in its snapshot summary, and reading it back.

Every key a commit writes is a constant here (``Key``); the job writes them (``RunTotals.summary``) and
the CLI, the reports and the launcher read them (``RunRecord``), so the two cannot drift apart. Summary
values are strings (Iceberg's rule); numbers are parsed back with a default when a key is missing (runs
committed by older versions).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icebatch.core.errors import WatermarkError
from icebatch.core.instances import BillingRate

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot

PREFIX = "icebatch."
NONE = "none"


class Key:
    """Snapshot summary properties of a ledger commit."""

    WATERMARK = PREFIX + "source-snapshot-id"  # T, inclusive: the new watermark
    SEQUENCE = PREFIX + "source-sequence-number"  # sequence number of T (survives T's expiry)
    FROM_SNAPSHOT = PREFIX + "source-from-snapshot-id"  # W, exclusive ("none" on the first run)
    SOURCE_TABLE = PREFIX + "source-table"
    CONSUMER = PREFIX + "consumer"
    TASK = PREFIX + "task"
    TASK_VERSION = PREFIX + "task-version"
    RUN_ID = PREFIX + "run-id"
    RESET_REASON = PREFIX + "reset-reason"
    # totals of the run
    ROWS = PREFIX + "rows"
    ROWS_OK = PREFIX + "rows-ok"
    ROWS_ERROR = PREFIX + "rows-error"
    ROWS_TRUNCATED = PREFIX + "rows-truncated"
    INPUT_TOKENS = PREFIX + "input-tokens"
    OUTPUT_TOKENS = PREFIX + "output-tokens"
    ENGINE_SECONDS = PREFIX + "engine-seconds"
    FIRST_RESULT_SECONDS = PREFIX + "first-result-seconds"
    ENGINE_STARTUP_SECONDS = PREFIX + "engine-startup-seconds"
    JOB_SECONDS = PREFIX + "job-seconds"
    STARTED_AT = PREFIX + "started-at"
    MODEL = PREFIX + "model"
    DEVICE = PREFIX + "device"
    GPUS = PREFIX + "gpus"
    GPU_HOURLY_RATE = PREFIX + "gpu-hourly-rate"
    GPU_INSTANCE_TYPE = PREFIX + "gpu-instance-type"
    GPU_RATE_SOURCE = PREFIX + "gpu-rate-source"
    RAYJOB_NAME = PREFIX + "rayjob-name"


# Table properties of the ledger: pyiceberg's own commit retry would re-apply an append on top of a
# competing run's commit (see ResultsLedger.commit).
NO_RETRIES = {"commit.retry.num-retries": "0"}


@dataclass(frozen=True)
class Watermark:
    """A consumer's progress (for one task version) as recorded in the ledger."""

    source_snapshot_id: int | None  # last processed source snapshot (inclusive); None = nothing yet
    ledger_snapshot_id: int | None  # ledger snapshot that recorded it
    run_id: str | None = None
    committed_at_ms: int | None = None
    source_sequence_number: int | None = None


@dataclass(frozen=True)
class RunTotals:
    """What a run did, recorded with its commit."""

    rows: int
    rows_ok: int
    rows_error: int
    input_tokens: int
    output_tokens: int
    engine_seconds: float = 0.0
    first_result_seconds: float = 0.0
    engine_startup_seconds: float | None = None
    job_seconds: float = 0.0
    rows_truncated: int = 0
    model: str = "-"
    device: str = "-"
    gpus: int = 1
    billing: BillingRate | None = None
    started_at: str = ""
    rayjob_name: str = ""

    def summary(self) -> dict[str, str]:
        props = {
            Key.ROWS: str(self.rows),
            Key.ROWS_OK: str(self.rows_ok),
            Key.ROWS_ERROR: str(self.rows_error),
            Key.ROWS_TRUNCATED: str(self.rows_truncated),
            Key.INPUT_TOKENS: str(self.input_tokens),
            Key.OUTPUT_TOKENS: str(self.output_tokens),
            Key.ENGINE_SECONDS: f"{self.engine_seconds:.3f}",
            Key.FIRST_RESULT_SECONDS: f"{self.first_result_seconds:.3f}",
            Key.JOB_SECONDS: f"{self.job_seconds:.3f}",
            Key.MODEL: self.model,
            Key.DEVICE: self.device,
            Key.GPUS: str(self.gpus),
            Key.STARTED_AT: self.started_at,
            Key.RAYJOB_NAME: self.rayjob_name,
        }
        if self.engine_startup_seconds is not None:
            props[Key.ENGINE_STARTUP_SECONDS] = f"{self.engine_startup_seconds:.3f}"
        if self.billing is not None:
            props[Key.GPU_HOURLY_RATE] = f"{self.billing.usd_per_hour:g}"
            props[Key.GPU_INSTANCE_TYPE] = self.billing.instance_type or ""
            props[Key.GPU_RATE_SOURCE] = self.billing.source
        return props


@dataclass(frozen=True)
class RunRecord:
    """A committed run, read back from a ledger snapshot summary."""

    run_id: str
    ledger_snapshot_id: int
    committed_at_ms: int
    from_snapshot_exclusive: int | None
    to_snapshot_inclusive: int
    task: str
    task_version: int
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_reset(self) -> bool:
        return Key.RESET_REASON in self.properties

    def number(self, key: str, default: float = 0.0) -> float:
        try:
            return float(self.properties.get(key, default))
        except ValueError:
            return default

    def text(self, key: str, default: str = "") -> str:
        return self.properties.get(key) or default

    def totals(self, billing_default: BillingRate) -> RunTotals:
        """The run's totals; a missing figure (an older run) falls back to a neutral default."""
        startup = self.properties.get(Key.ENGINE_STARTUP_SECONDS)
        engine = self.number(Key.ENGINE_SECONDS)
        return RunTotals(
            rows=int(self.number(Key.ROWS)),
            rows_ok=int(self.number(Key.ROWS_OK)),
            rows_error=int(self.number(Key.ROWS_ERROR)),
            input_tokens=int(self.number(Key.INPUT_TOKENS)),
            output_tokens=int(self.number(Key.OUTPUT_TOKENS)),
            engine_seconds=engine,
            first_result_seconds=self.number(Key.FIRST_RESULT_SECONDS),
            engine_startup_seconds=float(startup) if startup else None,
            job_seconds=self.number(Key.JOB_SECONDS, engine),
            rows_truncated=int(self.number(Key.ROWS_TRUNCATED)),
            model=self.text(Key.MODEL, "-"),
            device=self.text(Key.DEVICE, "-"),
            gpus=int(self.number(Key.GPUS, 1)),
            billing=BillingRate(
                self.number(Key.GPU_HOURLY_RATE, billing_default.usd_per_hour),
                self.text(Key.GPU_INSTANCE_TYPE) or billing_default.instance_type,
                self.text(Key.GPU_RATE_SOURCE) or billing_default.source,
            ),
            started_at=self.text(Key.STARTED_AT),
            rayjob_name=self.text(Key.RAYJOB_NAME),
        )


# ---------------------------------------------------------------------------------------------------
# Reading the ledger's metadata
# ---------------------------------------------------------------------------------------------------
def parse_snapshot_id(value: str | None, *, where: str) -> int | None:
    if value is None or value == NONE:
        return None
    try:
        return int(value)
    except ValueError as e:
        raise WatermarkError(
            f"{where} holds a corrupt watermark {value[:40]!r} (expected a snapshot id). Fix: "
            "`icebatch ledger reset --to-snapshot <id>` records a valid one"
        ) from e


def task_version_of(summary: Mapping[str, str]) -> int:
    """The task version a commit was made for (runs from before versions were recorded: 1)."""
    try:
        return int(summary.get(Key.TASK_VERSION) or "1")  # (pyiceberg's Summary.get has no default)
    except ValueError:
        return 1


def read_watermark(ledger_meta: TableMetadata | None, source_table: str, task_version: int) -> Watermark:
    """The newest ledger snapshot (along main's ancestry) that records a watermark for this task version."""
    from pyiceberg.table.snapshots import ancestors_of

    if ledger_meta is None:
        return Watermark(None, None)
    for snap in ancestors_of(ledger_meta.current_snapshot(), ledger_meta):
        summary = snap.summary
        if summary is None or Key.WATERMARK not in summary or task_version_of(summary) != task_version:
            continue  # a compaction of the ledger, or another task version's progress
        recorded_source = summary.get(Key.SOURCE_TABLE)
        if recorded_source and recorded_source != source_table:
            raise WatermarkError(
                f"the results table records progress for source {recorded_source!r}, not {source_table!r}. "
                "Fix: give this consumer its own results table (consumers file)"
            )
        where = f"ledger snapshot {snap.snapshot_id}"
        wm = parse_snapshot_id(summary.get(Key.WATERMARK), where=where)
        seq = parse_snapshot_id(summary.get(Key.SEQUENCE), where=where)
        return Watermark(wm, snap.snapshot_id, summary.get(Key.RUN_ID), snap.timestamp_ms, seq)
    return Watermark(None, None)


def record(snap: Snapshot) -> RunRecord:
    assert snap.summary is not None
    props = dict(snap.summary.additional_properties)
    where = f"ledger snapshot {snap.snapshot_id}"
    return RunRecord(
        run_id=props.get(Key.RUN_ID, ""),
        ledger_snapshot_id=snap.snapshot_id,
        committed_at_ms=snap.timestamp_ms,
        from_snapshot_exclusive=parse_snapshot_id(props.get(Key.FROM_SNAPSHOT), where=where),
        to_snapshot_inclusive=parse_snapshot_id(props.get(Key.WATERMARK), where=where) or 0,
        task=props.get(Key.TASK, ""),
        task_version=task_version_of(props),
        properties=props,
    )


def find_run(ledger_meta: TableMetadata | None, run_id: str) -> RunRecord | None:
    """The ledger snapshot committed by ``run_id``, if any."""
    if ledger_meta is None:
        return None
    for snap in sorted(ledger_meta.snapshots, key=lambda s: s.timestamp_ms, reverse=True):
        if snap.summary is not None and snap.summary.get(Key.RUN_ID) == run_id:
            return record(snap)
    return None


def list_runs(ledger_meta: TableMetadata | None) -> list[RunRecord]:
    """Committed runs (and resets) along main's ancestry, newest first, every task version."""
    from pyiceberg.table.snapshots import ancestors_of

    if ledger_meta is None:
        return []
    return [
        record(s)
        for s in ancestors_of(ledger_meta.current_snapshot(), ledger_meta)
        if s.summary is not None and Key.RUN_ID in s.summary
    ]


def now_ms() -> int:
    return int(time.time() * 1000)
