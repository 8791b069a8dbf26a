"""What a ledger commit records in its snapshot summary, and reading it back.

Every key a commit writes is a constant here (``Key``); the job writes them (``RunTotals.summary``) and
the CLI, the reports and the launcher read them (``RunRecord``), so the two cannot drift apart. Summary
values are strings (Iceberg's rule); numbers are parsed back with a default when a key is missing (runs
committed by older versions).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from icebatch.core.costs.before_job import BeforeJob
from icebatch.core.costs.instances import BillingRate
from icebatch.core.errors import WatermarkError
from icebatch.core.ledger.columns import parse_field_ids
from icebatch.core.ledger.lineage import ancestry
from icebatch.core.untrusted import INT64_MAX, summarize, whole_number

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger(__name__)

PREFIX = "icebatch."
NONE = "none"


class Key:
    """Snapshot summary properties of a ledger commit."""

    WATERMARK = PREFIX + "source-snapshot-id"  # T, inclusive: the new watermark
    SEQUENCE = PREFIX + "source-sequence-number"  # sequence number of T (survives T's expiry)
    FROM_SNAPSHOT = PREFIX + "source-from-snapshot-id"  # W, exclusive ("none" on the first run)
    FROM_SEQUENCE = PREFIX + "source-from-sequence-number"  # sequence number of W (a chunk outlives W's commit)
    SOURCE_TABLE = PREFIX + "source-table"
    SOURCE_UUID = PREFIX + "source-table-uuid"  # which table: a name can be dropped and created again
    SOURCE_FORMAT_VERSION = PREFIX + "source-format-version"
    SOURCE_FIELD_IDS = PREFIX + "source-field-ids"  # {task's column: field id} read (a rename keeps the id)
    # the highest id of the source's rows up to the watermark (``icebatch_job.plan.id_bounds``): a range whose ids
    # all lie above it appends new rows only; one whose ids may not is matched by content (a writer's retry)
    SOURCE_ID_UPPER = PREFIX + "source-id-upper"
    CONSUMER = PREFIX + "consumer"
    TASK = PREFIX + "task"
    TASK_VERSION = PREFIX + "task-version"
    RUN_ID = PREFIX + "run-id"
    RESET_REASON = PREFIX + "reset-reason"
    CLOSED = PREFIX + "closed-reason"  # a run part way through ended where it was: why (its range's end expired)
    # chunked progress: every commit of a run (its chunks; the last one also moves the watermark)
    RANGE_END = PREFIX + "range-end-snapshot-id"  # T of the run's pinned range
    RANGE_END_SEQUENCE = PREFIX + "range-end-sequence-number"
    RANGE_ROWS = PREFIX + "range-rows"  # source rows the range holds
    ROWS_COMMITTED = PREFIX + "rows-committed"  # of the range, this commit included
    CHUNK = PREFIX + "chunk"  # 1, 2, ... over the run, whichever attempt committed it
    ATTEMPT = PREFIX + "attempt"  # the attempt that committed this chunk (1, 2, ...)
    ATTEMPT_ID = PREFIX + "attempt-id"  # unique per process: attempts numbered alike stay apart
    ATTEMPT_SECONDS = PREFIX + "attempt-seconds"  # the committing attempt's lifetime so far
    COMMIT_ID = PREFIX + "commit-id"  # <run id>/<attempt id>/<chunk>: settles an unknown commit outcome
    ROWS_REDONE = PREFIX + "rows-redone"  # inferred again because another attempt had committed them
    ATTEMPTS = PREFIX + "attempts"  # attempts the run has taken so far (distinct attempt ids)
    # a range that deleted or rewrote rows (the last commit): matched by content, verdicts removed
    ROWS_UNCHANGED = PREFIX + "rows-unchanged"  # rows with a verdict for the same content: not sent to the model
    VERDICTS_GONE = PREFIX + "verdicts-removed-deleted"  # ids no longer in the source: their verdicts removed
    VERDICTS_SUPERSEDED = PREFIX + "verdicts-removed-superseded"  # replaced by this run's (the row changed)
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
    # of which, as vLLM timed them (``icebatch_job.process.engine_start``): the checkpoint's load, the warm-up
    ENGINE_WEIGHTS_SECONDS = PREFIX + "engine-weights-seconds"
    ENGINE_WARMUP_SECONDS = PREFIX + "engine-warmup-seconds"
    JOB_SECONDS = PREFIX + "job-seconds"
    STARTED_AT = PREFIX + "started-at"
    MODEL = PREFIX + "model"
    DEVICE = PREFIX + "device"
    GPUS = PREFIX + "gpus"
    GPU_HOURLY_RATE = PREFIX + "gpu-hourly-rate"
    GPU_INSTANCE_TYPE = PREFIX + "gpu-instance-type"
    GPU_RATE_SOURCE = PREFIX + "gpu-rate-source"
    RAYJOB_NAME = PREFIX + "rayjob-name"
    # a lingering job (``icebatch_job.linger``): a run it took warm has no start-up and no cluster tail of its own;
    # the run that first kept the node pays the job's last idle window (billed as idle tail)
    WARM_START = PREFIX + "warm-start"
    LINGER_SECONDS = PREFIX + "linger-seconds"
    # a shared job (``icebatch_job.shared``): the part of its node this run paid (by tokens) and the other consumers
    SHARE = PREFIX + "share"
    # what came before the job's process (the launch to its start: the GPU node, the image pull, the Ray cluster),
    # measured by the job from the launcher's submission time (``ICEBATCH_JOB_LAUNCHED_AT``), summed over attempts
    BEFORE_JOB_SECONDS = PREFIX + "before-job-seconds"
    # where it went (``icebatch.core.costs.before_job``): to the node's boot, then to its container's start (the image)
    BEFORE_JOB_NODE_SECONDS = PREFIX + "before-job-node-seconds"
    BEFORE_JOB_IMAGE_SECONDS = PREFIX + "before-job-image-seconds"
    SHARED_WITH = PREFIX + "shared-with"


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
    source_uuid: str | None = None  # the source table the newest commit was made on (None: older commits)
    source_uuid_at: int | None = None  # the ledger snapshot that recorded it
    source_field_ids: Mapping[str, int] | None = None  # the task's columns, as that commit read them
    closed: bool = False  # recorded by closing a run part way through: its verdicts stand, the next run matches
    # its rows by content (``ResultsLedger.plan``)
    source_id_upper: str | None = None  # ``Key.SOURCE_ID_UPPER`` as recorded (None: not recorded)


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
    engine_weights_seconds: float | None = None  # of the start-up, loading the checkpoint (None: not measured)
    engine_warmup_seconds: float | None = None  # then profiling, the KV cache and the warm-up (None: not measured)
    job_seconds: float = 0.0
    rows_truncated: int = 0
    model: str = "-"
    device: str = "-"
    gpus: int = 1
    billing: BillingRate | None = None
    started_at: str = ""
    rayjob_name: str = ""
    attempts: int = 1
    rows_redone: int = 0
    warm: bool = False  # taken by a job that lingered after another run: its node, Ray and weights were up
    linger_seconds: float = 0.0  # the job's last idle window, paid by the run that first kept the node
    share: float = 1.0  # the part of its job's node the run pays: a shared job's runs split it by tokens
    shared_with: tuple[str, ...] = ()  # the other consumers whose runs the job took through the same engine
    before_job_seconds: float = 0.0  # from the launch to the job's process (node, image, Ray cluster), every attempt
    before_job_node_seconds: float | None = None  # of which to the GPU node's boot (None: not measured)
    before_job_image_seconds: float | None = None  # then to its container's start: joining, the image pull

    @property
    def before_job(self) -> BeforeJob:
        return BeforeJob(self.before_job_seconds, self.before_job_node_seconds, self.before_job_image_seconds)

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
            Key.ROWS_REDONE: str(self.rows_redone),
            Key.ATTEMPTS: str(self.attempts),
        }
        if self.warm:
            props[Key.WARM_START] = "1"
        if self.linger_seconds:
            props[Key.LINGER_SECONDS] = f"{self.linger_seconds:.3f}"
        if self.before_job_seconds:
            props[Key.BEFORE_JOB_SECONDS] = f"{self.before_job_seconds:.3f}"
            if self.before_job_node_seconds is not None and self.before_job_image_seconds is not None:
                props[Key.BEFORE_JOB_NODE_SECONDS] = f"{self.before_job_node_seconds:.3f}"
                props[Key.BEFORE_JOB_IMAGE_SECONDS] = f"{self.before_job_image_seconds:.3f}"
        if self.shared_with:
            props[Key.SHARE] = f"{self.share:.6f}"
            props[Key.SHARED_WITH] = ",".join(self.shared_with)
        if self.engine_startup_seconds is not None:
            props[Key.ENGINE_STARTUP_SECONDS] = f"{self.engine_startup_seconds:.3f}"
        for key, seconds in (
            (Key.ENGINE_WEIGHTS_SECONDS, self.engine_weights_seconds),
            (Key.ENGINE_WARMUP_SECONDS, self.engine_warmup_seconds),
        ):
            if seconds is not None:
                props[key] = f"{seconds:.3f}"
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
    range_end: int = 0  # T of the run's range (= to_snapshot_inclusive once the run is complete)
    corrupt: str | None = None  # listed only (``listed``): why its range or version cannot be read

    @property
    def is_reset(self) -> bool:
        return Key.RESET_REASON in self.properties

    @property
    def warm(self) -> bool:
        """Taken by a lingering job: its start-up is not a cold start's (``pace`` leaves it out)."""
        return self.properties.get(Key.WARM_START) == "1"

    @property
    def share(self) -> float:
        """The part of its job's node the run paid (1 unless a shared job's; unreadable: 1, the whole node)."""
        share = self.number(Key.SHARE, 1.0)
        return share if 0 < share <= 1 else 1.0

    @property
    def closed_reason(self) -> str | None:
        """Why a run part way through was closed where it was (its committed verdicts stand), if it was."""
        return self.properties.get(Key.CLOSED)

    def number(self, key: str, default: float = 0.0) -> float:
        """A reported figure (rows, tokens, seconds, a rate); missing or unreadable: the default."""
        try:
            value = float(self.properties.get(key, default))
        except ValueError:
            return default
        return value if math.isfinite(value) and value >= 0 else default

    @property
    def before_job(self) -> BeforeJob:
        """What the run's attempts spent before their jobs' processes, and where it went where it was measured."""
        node, image = self.measured(Key.BEFORE_JOB_NODE_SECONDS), self.measured(Key.BEFORE_JOB_IMAGE_SECONDS)
        return BeforeJob(self.number(Key.BEFORE_JOB_SECONDS), node, image)

    def measured(self, key: str) -> float | None:
        """A figure that is only there when it was measured: None when it is missing or unreadable."""
        value = self.number(key, -1.0)
        return None if value < 0 else value

    def count(self, key: str, default: int) -> int:
        """A figure the protocol acts on (a chunk's range and position): missing = the default, corrupt = an error."""
        value = self.properties.get(key)
        where = f"ledger snapshot {self.ledger_snapshot_id}"
        return default if value is None else _whole_number(value, where=where, what=key)

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
            engine_weights_seconds=self.measured(Key.ENGINE_WEIGHTS_SECONDS),
            engine_warmup_seconds=self.measured(Key.ENGINE_WARMUP_SECONDS),
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
            attempts=int(self.number(Key.ATTEMPTS, 1)),
            rows_redone=int(self.number(Key.ROWS_REDONE)),
            warm=self.warm,
            linger_seconds=self.number(Key.LINGER_SECONDS),
            share=self.share,
            shared_with=tuple(n for n in self.text(Key.SHARED_WITH).split(",") if n),
            before_job_seconds=self.before_job.seconds,
            before_job_node_seconds=self.before_job.node_seconds,
            before_job_image_seconds=self.before_job.image_seconds,
        )


def as_recorded(totals: RunTotals, billing_default: BillingRate) -> RunTotals:
    """``totals`` as a ledger commit records them (their summary's text, read back as every reader of the ledger reads
    it): a report made from these agrees with `icebatch runs`, `costs` and the budget to the last digit."""
    record = RunRecord("", 0, 0, None, 0, "", 0, totals.summary())
    return record.totals(billing_default)


# ---------------------------------------------------------------------------------------------------
# Reading the ledger's metadata
# ---------------------------------------------------------------------------------------------------
def parse_snapshot_id(value: str | None, *, where: str) -> int | None:
    """A snapshot id or sequence number from a summary ("none" = no snapshot yet); anything else is corrupt."""
    if value is None or value == NONE:
        return None
    return _whole_number(value, where=where, what="watermark")


def _whole_number(value: str, *, where: str, what: str) -> int:
    """Exactly the digits a commit writes (no sign, spaces, underscores or non-ASCII digits), 0 to 2^63-1."""
    number = whole_number(value)
    if number is not None:
        return number
    raise WatermarkError(
        f"{where} holds a corrupt {what} {value[:40]!r} (expected a whole number from 0 to {INT64_MAX}). Fix: "
        "`icebatch ledger reset --to-snapshot <id>` records a valid watermark"
    )


def task_version_of(summary: Mapping[str, str], *, where: str) -> int:
    """The task version a commit was made for (runs from before versions were recorded: 1).

    A version that is not one (``"2.0"``, ``"-1"``) is an error: taken as 1, the commit would move version
    1's watermark.
    """
    value = summary.get(Key.TASK_VERSION)
    if value is None:
        return 1
    version = whole_number(value, 1, 2**31 - 1)
    if version is None:
        raise WatermarkError(
            f"{where} holds a corrupt {Key.TASK_VERSION} {summarize(value, 40)!r} (expected a task version, 1 or "
            "more). Fix: `icebatch ledger reset --to-snapshot <id>` records a valid watermark"
        )
    return version


def _check_source(summary: Mapping[str, str], source_table: str) -> None:
    recorded_source = summary.get(Key.SOURCE_TABLE)
    if recorded_source and recorded_source != source_table:
        raise WatermarkError(
            f"the results table records progress for source {recorded_source!r}, not {source_table!r}. "
            "Fix: give this consumer its own results table (consumers file)"
        )


def properties(snap: Snapshot) -> dict[str, str]:
    """A snapshot's summary properties as a plain dict.

    (pyiceberg's ``Summary`` answers ``None`` for a missing key instead of raising, so ``key in summary``
    is always true on it: never test membership on a ``Summary``.)
    """
    return dict(snap.summary.additional_properties) if snap.summary is not None else {}


def _is_progress(snap: Snapshot, props: Mapping[str, str], task_version: int) -> bool:
    """A commit of this task version's progress: a run's chunk, its last commit, or a reset."""
    if Key.WATERMARK not in props and Key.CHUNK not in props:
        return False  # a compaction of the ledger, or some other writer's commit
    return task_version_of(props, where=f"ledger snapshot {snap.snapshot_id}") == task_version


def read_watermark(ledger_meta: TableMetadata | None, source_table: str, task_version: int) -> Watermark:
    """The newest ledger snapshot (along main's ancestry) that records a watermark for this task version."""
    return read_progress(ledger_meta, source_table, task_version).watermark


@dataclass(frozen=True)
class Pending:
    """A run whose range is partly committed: some chunks landed, its last commit (the watermark) not yet."""

    run_id: str
    from_snapshot_exclusive: int | None
    to_snapshot_inclusive: int
    to_sequence_number: int | None
    range_rows: int
    rows_committed: int
    chunks: int
    chunk_snapshot_ids: tuple[int, ...]  # oldest first
    attempts: int  # distinct attempts that committed a chunk
    attempt_seconds: float  # summed over those attempts: each one's lifetime at its last commit
    head: RunRecord  # the newest chunk: its totals are the run's so far

    @property
    def rows_remaining(self) -> int:
        return max(0, self.range_rows - self.rows_committed)

    def describe(self) -> str:
        return (
            f"run {self.run_id}: {self.rows_committed:,} of {self.range_rows:,} rows committed in {self.chunks} "
            f"chunk{'s' if self.chunks != 1 else ''} by {self.attempts} attempt{'s' if self.attempts != 1 else ''}"
        )


@dataclass(frozen=True)
class Progress:
    """A consumer's progress for one task version: its watermark, a partly committed run, and the CAS value."""

    watermark: Watermark
    head_snapshot_id: int | None  # the newest commit of this task version (chunk or watermark): what a commit expects
    pending: Pending | None = None


def read_progress(ledger_meta: TableMetadata | None, source_table: str, task_version: int) -> Progress:
    """Walk main's ancestry back to this task version's watermark, collecting the chunks committed since."""
    if ledger_meta is None or ledger_meta.current_snapshot() is None:
        return Progress(Watermark(None, None), None)
    head: int | None = None
    table: tuple[str, int, str | None] | None = None  # (UUID, ledger snapshot, field ids) of the newest recording
    chunks: list[Snapshot] = []
    watermark = Watermark(None, None)
    for snap in ancestry(ledger_meta.current_snapshot(), ledger_meta):
        summary = properties(snap)
        if not _is_progress(snap, summary, task_version):
            continue
        _check_source(summary, source_table)
        head = snap.snapshot_id if head is None else head
        if table is None and summary.get(Key.SOURCE_UUID):
            table = (summary[Key.SOURCE_UUID], snap.snapshot_id, summary.get(Key.SOURCE_FIELD_IDS))
        if Key.WATERMARK not in summary:
            chunks.append(snap)
            continue
        where = f"ledger snapshot {snap.snapshot_id}"
        wm = parse_snapshot_id(summary.get(Key.WATERMARK), where=where)
        seq = parse_snapshot_id(summary.get(Key.SEQUENCE), where=where)
        watermark = Watermark(
            wm,
            snap.snapshot_id,
            summary.get(Key.RUN_ID),
            snap.timestamp_ms,
            seq,
            closed=Key.CLOSED in summary,
            source_id_upper=summary.get(Key.SOURCE_ID_UPPER),
        )
        break
    else:
        if chunks:  # the history was expired under a run part way through: its chunks say where it started
            watermark = _started_from(chunks[-1])
    if table is not None:
        uuid, at, field_ids = table
        ids = parse_field_ids(field_ids, where=f"ledger snapshot {at}")
        watermark = replace(watermark, source_uuid=uuid, source_uuid_at=at, source_field_ids=ids)
    return Progress(watermark, head, _pending(chunks[::-1], watermark) if chunks else None)


def recorded_source(ledger_meta: TableMetadata | None, task_version: int) -> tuple[str, int, str | None] | None:
    """(UUID, ledger snapshot, field ids) of the source table this task version's newest commit recording one
    was made on.

    Reads nothing else of the commits (``read_progress`` refuses a corrupt one; a reset, which is the fix for
    it, still needs to know which table the ledger follows)."""
    if ledger_meta is None:
        return None
    for snap in ancestry(ledger_meta.current_snapshot(), ledger_meta):
        summary = properties(snap)
        try:
            mine = _is_progress(snap, summary, task_version)
        except WatermarkError:
            continue
        if mine and summary.get(Key.SOURCE_UUID):
            return summary[Key.SOURCE_UUID], snap.snapshot_id, summary.get(Key.SOURCE_FIELD_IDS)
    return None


def _started_from(oldest_chunk: Snapshot) -> Watermark:
    """The watermark a run's chunk was committed on (each chunk's compare-and-set checked it)."""
    r = record(oldest_chunk)
    if r.from_snapshot_exclusive is None:
        return Watermark(None, None)
    seq = parse_snapshot_id(r.properties.get(Key.FROM_SEQUENCE), where=f"ledger snapshot {r.ledger_snapshot_id}")
    return Watermark(r.from_snapshot_exclusive, None, source_sequence_number=seq)


def _pending(chunks: list[Snapshot], watermark: Watermark) -> Pending:
    """The partly committed run, from its chunks (oldest first); they must all be of one range from W."""
    records = [record(s) for s in chunks]
    newest = records[-1]
    for r in records:
        starts = r.from_snapshot_exclusive
        if (r.run_id, starts, r.range_end) != (newest.run_id, watermark.source_snapshot_id, newest.range_end):
            raise WatermarkError(
                f"ledger snapshot {r.ledger_snapshot_id} records a chunk of run {r.run_id[:80]!r} over "
                f"({starts}, {r.range_end}], which does not continue the watermark {watermark.source_snapshot_id}. "
                "Fix: `icebatch ledger reset --to-snapshot <id>` records where to resume"
            )
    seconds: dict[str, float] = {}
    for r in records:
        seconds[r.text(Key.ATTEMPT_ID, r.run_id)] = r.number(Key.ATTEMPT_SECONDS)
    attempts, attempt_seconds = len(seconds), sum(seconds.values())
    if records[0].count(Key.CHUNK, 1) > 1:  # earlier chunks expired: the newest holds the run's totals so far
        attempts = max(attempts, int(newest.number(Key.ATTEMPTS, attempts)))
        attempt_seconds = max(attempt_seconds, newest.number(Key.JOB_SECONDS, attempt_seconds))
    where = f"ledger snapshot {newest.ledger_snapshot_id}"
    return Pending(
        run_id=newest.run_id,
        from_snapshot_exclusive=watermark.source_snapshot_id,
        to_snapshot_inclusive=newest.range_end,
        to_sequence_number=parse_snapshot_id(newest.properties.get(Key.RANGE_END_SEQUENCE), where=where),
        range_rows=newest.count(Key.RANGE_ROWS, 0),
        rows_committed=newest.count(Key.ROWS_COMMITTED, 0),
        chunks=newest.count(Key.CHUNK, len(records)),  # numbered over the run: expired chunks count
        chunk_snapshot_ids=tuple(r.ledger_snapshot_id for r in records),
        attempts=attempts,
        attempt_seconds=attempt_seconds,
        head=newest,
    )


def record(snap: Snapshot) -> RunRecord:
    props = properties(snap)
    where = f"ledger snapshot {snap.snapshot_id}"
    return RunRecord(
        run_id=props.get(Key.RUN_ID, ""),
        ledger_snapshot_id=snap.snapshot_id,
        committed_at_ms=snap.timestamp_ms,
        from_snapshot_exclusive=parse_snapshot_id(props.get(Key.FROM_SNAPSHOT), where=where),
        to_snapshot_inclusive=parse_snapshot_id(props.get(Key.WATERMARK), where=where) or 0,
        task=props.get(Key.TASK, ""),
        task_version=task_version_of(props, where=where),
        properties=props,
        range_end=parse_snapshot_id(props.get(Key.RANGE_END) or props.get(Key.WATERMARK), where=where) or 0,
    )


def listed(snap: Snapshot) -> RunRecord:
    """``record`` for a listing (runs, the day's spend, estimates' priors): a commit whose range or task
    version cannot be read is listed as corrupt, its figures kept, rather than failing every listing, and
    the launches that read them, for as long as it stays in the history (a reset does not remove it)."""
    try:
        return record(snap)
    except WatermarkError as e:
        log.warning("listing runs: %s", e)
        props = properties(snap)
        return RunRecord(
            run_id=props.get(Key.RUN_ID, ""),
            ledger_snapshot_id=snap.snapshot_id,
            committed_at_ms=snap.timestamp_ms,
            from_snapshot_exclusive=None,
            to_snapshot_inclusive=0,
            task=props.get(Key.TASK, ""),
            task_version=0,  # unknown: no version's estimate learns from it
            properties=props,
            corrupt=str(e),
        )


def find_run(ledger_meta: TableMetadata | None, run_id: str) -> RunRecord | None:
    """The ledger snapshot that completed ``run_id`` (moved the watermark), if any; an unreadable one is
    returned with ``corrupt`` set (the run did complete)."""
    if ledger_meta is None:
        return None
    for snap in sorted(ledger_meta.snapshots, key=lambda s: s.timestamp_ms, reverse=True):
        s = properties(snap)
        if s.get(Key.RUN_ID) == run_id and Key.WATERMARK in s:
            return listed(snap)  # it completed, readable or not (``corrupt``): the backlog reports corruption
    return None


def find_commit(ledger_meta: TableMetadata | None, commit_id: str) -> RunRecord | None:
    """The ledger snapshot of one chunk commit (``Key.COMMIT_ID``), if it landed."""
    if ledger_meta is None:
        return None
    for snap in sorted(ledger_meta.snapshots, key=lambda s: s.timestamp_ms, reverse=True):
        if properties(snap).get(Key.COMMIT_ID) == commit_id:
            return record(snap)
    return None


def list_runs(ledger_meta: TableMetadata | None) -> list[RunRecord]:
    """Completed runs (and resets) along main's ancestry, newest first, every task version (chunks: ``Pending``);
    an unreadable one is listed with ``corrupt`` set."""
    if ledger_meta is None:
        return []
    return [
        listed(s)
        for s in ancestry(ledger_meta.current_snapshot(), ledger_meta)
        if Key.RUN_ID in (props := properties(s)) and Key.WATERMARK in props
    ]


def now_ms() -> int:
    return int(time.time() * 1000)
