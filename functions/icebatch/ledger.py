"""The incremental protocol: what is new, which rows exactly, and recording that they are done.

The unit of progress is the **source snapshot id**. A run processes exactly the rows appended by
``append`` snapshots after the consumer's watermark W (exclusive) up to a pinned snapshot T (inclusive).

Progress lives in the consumer's **results table** (the ledger), never in the source table: the results
of a run and its new watermark are one Iceberg commit whose snapshot summary carries
``icebatch.source-snapshot-id = T`` (plus run id, range and totals). Results and progress therefore
cannot disagree, and the source table stays read-only.

The commit is a compare-and-set: it lands only if the ledger's watermark is still W, the value the run
planned from. pyiceberg's own commit retry is switched off for the ledger (it would re-apply the append
on top of a competing run's commit); instead a failed commit reloads the ledger and either retries (an
unrelated change, the watermark is still W), reports success (this run id is already there: the outcome
of an earlier attempt was only unknown) or reports a conflict (someone else moved the watermark: this
run's data files are deleted). At-least-once execution plus this idempotent commit is exactly-once in
effect.

What each snapshot operation means for the backlog:

- ``append``: its rows are new (``added-records`` from the summary; the manifest list when a writer
  left the summary incomplete). Data files are never opened.
- ``replace`` (compaction) and ``delete``: add no new rows; skipped.
- ``overwrite`` (MERGE/UPDATE, dynamic partition overwrite): its added rows are *not* processed (the
  incremental scan, like Spark's, reads appends only); they are counted in ``Backlog.skipped_rows`` and
  reported so that nobody mistakes them for done.

If the watermark is no longer in the history of the source table's current snapshot (rolled back, or
expired together with all its descendants' parents), the backlog cannot be computed safely: a
``WatermarkError`` says so and names the fix (``icebatch ledger reset``), instead of silently
reprocessing or skipping rows. A watermark snapshot that was merely expired is fine as long as it is the
parent of a snapshot that still exists.

Reading the rows of a range (Arrow batches, a Ray dataset) lives in ``icebatch_job.source``; writing
result rows into data files in ``icebatch_job.results``. Both only hand data files to ``commit`` here.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icebatch.catalog import SOURCE_FIX, load_table, open_catalog, table_exists
from icebatch.errors import (
    CommitOutcomeUnknownError,
    TableNotFoundError,
    WatermarkConflictError,
    WatermarkError,
)
from icebatch.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger(__name__)

# Snapshot summary properties written by a ledger commit.
PREFIX = "icebatch."
WATERMARK = PREFIX + "source-snapshot-id"  # T, inclusive: the new watermark
SEQUENCE = PREFIX + "source-sequence-number"  # sequence number of T (survives T's expiry)
FROM_SNAPSHOT = PREFIX + "source-from-snapshot-id"  # W, exclusive ("none" on the first run)
SOURCE_TABLE = PREFIX + "source-table"
CONSUMER = PREFIX + "consumer"
RUN_ID = PREFIX + "run-id"
# Table properties of the ledger.
NO_RETRIES = {"commit.retry.num-retries": "0"}


# ---------------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Watermark:
    """The consumer's progress as recorded in the ledger."""

    source_snapshot_id: int | None  # last processed source snapshot (inclusive); None = nothing yet
    ledger_snapshot_id: int | None  # ledger snapshot that recorded it
    run_id: str | None = None
    committed_at_ms: int | None = None
    source_sequence_number: int | None = None


@dataclass(frozen=True)
class SkippedSnapshot:
    snapshot_id: int
    operation: str
    added_rows: int


@dataclass(frozen=True)
class Backlog:
    """How much is new for a consumer, from metadata only."""

    source_table: str
    consumer: str
    watermark_snapshot_id: int | None
    current_snapshot_id: int | None
    rows: int
    snapshots: int  # append snapshots waiting
    oldest_pending_commit_ms: int | None  # commit time of the oldest waiting append snapshot
    skipped: tuple[SkippedSnapshot, ...] = ()
    pending_snapshot_ids: tuple[int, ...] = ()  # oldest first
    pending_rows: tuple[int, ...] = ()  # rows per pending snapshot, same order
    scan_from_exclusive: int | None = None  # where an incremental scan of the pending range starts

    @property
    def skipped_rows(self) -> int:
        return sum(s.added_rows for s in self.skipped)

    def oldest_pending_age_seconds(self, now_ms: int | None = None) -> float | None:
        """How long the oldest waiting row has been in the table (None when nothing waits)."""
        if self.oldest_pending_commit_ms is None:
            return None
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(0.0, (now - self.oldest_pending_commit_ms) / 1000)

    def to_dict(self, now_ms: int | None = None) -> dict[str, Any]:
        age = self.oldest_pending_age_seconds(now_ms)
        return {
            "source_table": self.source_table,
            "consumer": self.consumer,
            "watermark_snapshot_id": self.watermark_snapshot_id,
            "current_snapshot_id": self.current_snapshot_id,
            "backlog_rows": self.rows,
            "backlog_snapshots": self.snapshots,
            "oldest_unprocessed_age_seconds": None if age is None else round(age, 3),
            "skipped_rows": self.skipped_rows,
            "skipped_snapshots": [asdict(s) for s in self.skipped],
        }


@dataclass(frozen=True)
class RunPlan:
    """A pinned range for one run: rows appended in (from_exclusive, to_inclusive]."""

    run_id: str
    consumer: str
    source_table: str
    results_table: str
    from_snapshot_exclusive: int | None  # the watermark the run started from (the commit's CAS value)
    to_snapshot_inclusive: int
    expected_rows: int
    snapshots: int
    scan_from_exclusive: int | None = None  # = from_snapshot_exclusive unless that snapshot was expired
    to_sequence_number: int | None = None
    planned_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))


@dataclass(frozen=True)
class RunTotals:
    """Totals recorded in the ledger commit (strings in the snapshot summary)."""

    rows: int
    rows_ok: int
    rows_error: int
    input_tokens: int
    output_tokens: int
    engine_seconds: float = 0.0
    extra: Mapping[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, str]:
        props = {
            PREFIX + "rows": str(self.rows),
            PREFIX + "rows-ok": str(self.rows_ok),
            PREFIX + "rows-error": str(self.rows_error),
            PREFIX + "input-tokens": str(self.input_tokens),
            PREFIX + "output-tokens": str(self.output_tokens),
            PREFIX + "engine-seconds": f"{self.engine_seconds:.3f}",
        }
        props.update({PREFIX + k: v for k, v in self.extra.items()})
        return props


@dataclass(frozen=True)
class CommitResult:
    ledger_snapshot_id: int
    attempts: int
    already_committed: bool = False  # an earlier attempt of this run had landed


@dataclass(frozen=True)
class RunRecord:
    """A committed run, read back from a ledger snapshot summary."""

    run_id: str
    ledger_snapshot_id: int
    committed_at_ms: int
    from_snapshot_exclusive: int | None
    to_snapshot_inclusive: int
    properties: Mapping[str, str]

    def number(self, key: str, default: float = 0.0) -> float:
        try:
            return float(self.properties.get(PREFIX + key, default))
        except ValueError:
            return default


def new_run_id(consumer: str, now: datetime | None = None) -> str:
    """A sortable, unique run id: ``triage-20261129T073000-3fa9c2``."""
    ts = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
    return f"{consumer}-{ts}-{secrets.token_hex(3)}"


# ---------------------------------------------------------------------------------------------------
# Pure functions over metadata
# ---------------------------------------------------------------------------------------------------
def _parse_snapshot_id(value: str | None, *, where: str) -> int | None:
    if value is None or value == "none":
        return None
    try:
        return int(value)
    except ValueError as e:
        raise WatermarkError(
            f"{where} holds a corrupt watermark {value!r} (expected a snapshot id). Fix: "
            "`icebatch ledger reset --to-snapshot <id>` records a valid one"
        ) from e


def read_watermark(ledger_meta: TableMetadata | None, source_table: str) -> Watermark:
    """The newest ledger snapshot (along main's ancestry) that records a watermark."""
    from pyiceberg.table.snapshots import ancestors_of

    if ledger_meta is None:
        return Watermark(None, None)
    for snap in ancestors_of(ledger_meta.current_snapshot(), ledger_meta):
        summary = snap.summary
        if summary is None or WATERMARK not in summary:
            continue  # e.g. a compaction of the ledger
        recorded_source = summary.get(SOURCE_TABLE)
        if recorded_source and recorded_source != source_table:
            raise WatermarkError(
                f"the results table records progress for source {recorded_source!r}, not {source_table!r}. "
                "Fix: point ICEBATCH_RESULTS_TABLE at a results table of this source (or a new name)"
            )
        where = f"ledger snapshot {snap.snapshot_id}"
        wm = _parse_snapshot_id(summary.get(WATERMARK), where=where)
        seq = _parse_snapshot_id(summary.get(SEQUENCE), where=where)
        return Watermark(wm, snap.snapshot_id, summary.get(RUN_ID), snap.timestamp_ms, seq)
    return Watermark(None, None)


def find_run(ledger_meta: TableMetadata | None, run_id: str) -> RunRecord | None:
    """The ledger snapshot committed by ``run_id``, if any."""
    if ledger_meta is None:
        return None
    for snap in sorted(ledger_meta.snapshots, key=lambda s: s.timestamp_ms, reverse=True):
        if snap.summary is not None and snap.summary.get(RUN_ID) == run_id:
            return _record(snap)
    return None


def list_runs(ledger_meta: TableMetadata | None) -> list[RunRecord]:
    """Committed runs along main's ancestry, newest first."""
    from pyiceberg.table.snapshots import ancestors_of

    if ledger_meta is None:
        return []
    return [
        _record(s)
        for s in ancestors_of(ledger_meta.current_snapshot(), ledger_meta)
        if s.summary is not None and RUN_ID in s.summary
    ]


def _record(snap: Snapshot) -> RunRecord:
    assert snap.summary is not None
    props = dict(snap.summary.additional_properties)
    where = f"ledger snapshot {snap.snapshot_id}"
    return RunRecord(
        run_id=props.get(RUN_ID, ""),
        ledger_snapshot_id=snap.snapshot_id,
        committed_at_ms=snap.timestamp_ms,
        from_snapshot_exclusive=_parse_snapshot_id(props.get(FROM_SNAPSHOT), where=where),
        to_snapshot_inclusive=_parse_snapshot_id(props.get(WATERMARK), where=where) or 0,
        properties=props,
    )


def _added_rows(snap: Snapshot, io: FileIO) -> int:
    """Rows added by a snapshot: its summary, else its manifest list (never data files)."""
    summary = snap.summary
    added = summary.get("added-records") if summary is not None else None
    if added is not None:
        return int(added)
    from pyiceberg.manifest import ManifestContent

    return sum(
        m.added_rows_count or 0
        for m in snap.manifests(io)
        if m.content == ManifestContent.DATA and m.added_snapshot_id == snap.snapshot_id
    )


_RESET_FIX = "Fix: `icebatch ledger reset --to-snapshot <id>` chooses where to resume"


def _pending_snapshots(
    meta: TableMetadata, watermark: int | None, watermark_seq: int | None, upto: int | None
) -> list[Snapshot]:
    """Snapshots after the watermark up to ``upto`` (default: current), oldest first.

    The watermark is found in the ancestry of ``upto``. If it was expired, the ancestry is cut by its
    sequence number instead (recorded in the ledger; sequence numbers only grow), provided the oldest
    remaining snapshot directly follows it: otherwise snapshots after the watermark were expired before
    being processed and their rows can no longer be told apart.
    """
    from pyiceberg.table.snapshots import ancestors_of

    end = meta.snapshot_by_id(upto) if upto is not None else meta.current_snapshot()
    if upto is not None and end is None:
        raise WatermarkError(f"snapshot {upto} is not in the source table's metadata (expired?)")
    if end is None:
        return []
    ancestry = list(ancestors_of(end, meta))  # newest first
    if watermark is None:
        return ancestry[::-1]
    ids = [s.snapshot_id for s in ancestry]
    if watermark in ids:
        return ancestry[: ids.index(watermark)][::-1]
    if meta.snapshot_by_id(watermark) is not None:
        raise WatermarkError(
            f"the last processed snapshot {watermark} is not in the history of snapshot {end.snapshot_id}: "
            f"the source table was rolled back past it. {_RESET_FIX}"
        )
    if watermark_seq is None or meta.format_version < 2:
        raise WatermarkError(
            f"the last processed snapshot {watermark} was expired and the ledger holds no sequence number "
            f"to continue from. {_RESET_FIX}"
        )
    pending = [s for s in ancestry if (s.sequence_number or 0) > watermark_seq][::-1]
    kept = [s for s in ancestry if (s.sequence_number or 0) <= watermark_seq]
    if pending and not kept and (pending[0].sequence_number or 0) != watermark_seq + 1:
        raise WatermarkError(
            f"snapshots between the last processed snapshot {watermark} (sequence {watermark_seq}) and "
            f"{pending[0].snapshot_id} (sequence {pending[0].sequence_number}) were expired before they "
            f"were processed; their rows cannot be told apart any more. {_RESET_FIX}"
        )
    return pending


def compute_backlog(
    source_meta: TableMetadata,
    io: FileIO,
    *,
    source_table: str,
    consumer: str,
    watermark: int | None,
    watermark_seq: int | None = None,
    upto: int | None = None,
) -> Backlog:
    """Rows appended after ``watermark`` (exclusive) up to ``upto`` (inclusive, default: current)."""
    from pyiceberg.table.snapshots import Operation

    pending = _pending_snapshots(source_meta, watermark, watermark_seq, upto)
    rows = 0
    ids: list[int] = []
    per: list[int] = []
    oldest: int | None = None
    skipped: list[SkippedSnapshot] = []
    for snap in pending:
        op = snap.summary.operation if snap.summary is not None else Operation.APPEND
        if op == Operation.APPEND:
            added = _added_rows(snap, io)
            rows += added
            ids.append(snap.snapshot_id)
            per.append(added)
            if oldest is None and added > 0:
                oldest = snap.timestamp_ms
        elif op == Operation.OVERWRITE:
            skipped.append(SkippedSnapshot(snap.snapshot_id, op.value, _added_rows(snap, io)))
    current = pending[-1].snapshot_id if pending else (upto if upto is not None else source_meta.current_snapshot_id)
    return Backlog(
        scan_from_exclusive=pending[0].parent_snapshot_id if pending else watermark,
        source_table=source_table,
        consumer=consumer,
        watermark_snapshot_id=watermark,
        current_snapshot_id=current,
        rows=rows,
        snapshots=len(ids),
        oldest_pending_commit_ms=oldest,
        skipped=tuple(skipped),
        pending_snapshot_ids=tuple(ids),
        pending_rows=tuple(per),
    )


def pin_range_end(backlog: Backlog, max_rows: int | None) -> tuple[int | None, int]:
    """The last snapshot to include so that a run takes at most ``max_rows`` (whole snapshots, >= 1)."""
    if max_rows is None or backlog.rows <= max_rows:
        return backlog.current_snapshot_id, backlog.rows
    taken = 0
    end: int | None = None
    for sid, n in zip(backlog.pending_snapshot_ids, backlog.pending_rows, strict=True):
        if end is not None and taken + n > max_rows:
            break
        taken += n
        end = sid
    return end, taken


# ---------------------------------------------------------------------------------------------------
# The ledger of one consumer
# ---------------------------------------------------------------------------------------------------
class ResultsLedger:
    """One consumer's progress over one source table, kept in its results table.

    Example::

        ledger = ResultsLedger(catalog, "support.tickets", "support.tickets_triage_results", "triage")
        plan = ledger.plan()                       # None when nothing is new
        ...                                        # read plan's rows, write data files
        ledger.commit(plan, data_files, totals)    # results + watermark, one commit
    """

    def __init__(self, catalog: Catalog, source_table: str, results_table: str, consumer: str) -> None:
        self.catalog = catalog
        self.source_table = source_table
        self.results_table = results_table
        self.consumer = consumer

    # --- reading ---------------------------------------------------------------------------------
    def source(self) -> Table:
        return load_table(self.catalog, self.source_table, what="source table", fix=SOURCE_FIX)

    def results(self) -> Table | None:
        if not table_exists(self.catalog, self.results_table):
            return None
        return self.catalog.load_table(self.results_table)

    def watermark(self) -> Watermark:
        results = self.results()
        return read_watermark(results.metadata if results else None, self.source_table)

    def backlog(
        self, *, upto: int | None = None, source: Table | None = None, watermark: Watermark | None = None
    ) -> Backlog:
        """How much is new, from the source table's metadata (no data file is opened)."""
        source = source or self.source()
        wm = watermark or self.watermark()
        return compute_backlog(
            source.metadata,
            source.io,
            source_table=self.source_table,
            consumer=self.consumer,
            watermark=wm.source_snapshot_id,
            watermark_seq=wm.source_sequence_number,
            upto=upto,
        )

    def plan(
        self,
        *,
        run_id: str | None = None,
        from_snapshot_exclusive: int | str | None = "watermark",
        to_snapshot_inclusive: int | None = None,
        max_rows: int | None = None,
    ) -> RunPlan | None:
        """Pin the range of one run. None when there is nothing to do.

        The launcher passes the range it saw (``from_snapshot_exclusive``/``to_snapshot_inclusive``);
        if the watermark has moved since, the range is stale and WatermarkConflictError says so.
        """
        wm = self.watermark()
        if from_snapshot_exclusive != "watermark" and from_snapshot_exclusive != wm.source_snapshot_id:
            raise WatermarkConflictError(
                f"the launch expected watermark {from_snapshot_exclusive}, but the ledger is at "
                f"{wm.source_snapshot_id} (run {wm.run_id}): another run already covered this range"
            )
        source = self.source()
        backlog = self.backlog(upto=to_snapshot_inclusive, source=source, watermark=wm)
        end, rows = pin_range_end(backlog, max_rows)
        if end is None or rows == 0:
            return None  # nothing appended (replace/delete/overwrite snapshots add no work)
        ids = list(backlog.pending_snapshot_ids)
        snapshots = ids.index(end) + 1 if end in ids else len(ids)
        end_snapshot = source.metadata.snapshot_by_id(end)
        return RunPlan(
            scan_from_exclusive=backlog.scan_from_exclusive,
            to_sequence_number=end_snapshot.sequence_number if end_snapshot else None,
            run_id=run_id or new_run_id(self.consumer),
            consumer=self.consumer,
            source_table=self.source_table,
            results_table=self.results_table,
            from_snapshot_exclusive=wm.source_snapshot_id,
            to_snapshot_inclusive=end,
            expected_rows=rows,
            snapshots=snapshots,
        )

    def runs(self) -> list[RunRecord]:
        results = self.results()
        return list_runs(results.metadata if results else None)

    def find_run(self, run_id: str) -> RunRecord | None:
        results = self.results()
        return find_run(results.metadata if results else None, run_id)

    # --- writing ---------------------------------------------------------------------------------
    def ensure_results_table(self, schema: Schema) -> Table:
        """Create the results table (or add new columns to it). Turns pyiceberg's commit retry off."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        namespace = self.results_table.split(".")[0]
        if not self.catalog.namespace_exists(namespace):  # creating an existing one needs glue:CreateDatabase
            self.catalog.create_namespace_if_not_exists(namespace)
        props = {**NO_RETRIES, CONSUMER: self.consumer, SOURCE_TABLE: self.source_table}
        # Look before creating: a create writes a metadata file first, which an "already exists" orphans.
        if table_exists(self.catalog, self.results_table):
            table = self.catalog.load_table(self.results_table)
        else:
            try:
                table = self.catalog.create_table(self.results_table, schema, properties=props)
            except TableAlreadyExistsError:  # a concurrent run created it first
                table = self.catalog.load_table(self.results_table)
        missing = [f.name for f in schema.fields if table.schema().find_field(f.name, case_sensitive=False) is None]
        if missing:
            log.info("adding columns %s to %s", missing, self.results_table)
            with table.update_schema() as update:
                update.union_by_name(schema)
            table = self.catalog.load_table(self.results_table)
        if table.properties.get("commit.retry.num-retries") != "0":
            log.warning("turning pyiceberg's automatic commit retry off for %s", self.results_table)
            with table.transaction() as txn:
                txn.set_properties(NO_RETRIES)
            table = self.catalog.load_table(self.results_table)
        return table

    def commit(
        self,
        plan: RunPlan,
        data_files: Sequence[DataFile],
        totals: RunTotals,
        *,
        max_attempts: int = 5,
    ) -> CommitResult:
        """Append the results and move the watermark W -> T in one commit, iff the watermark is still W.

        Raises WatermarkConflictError when another run moved the watermark first (this run's data files
        are discarded), CommitOutcomeUnknownError when the catalog kept failing in ways that leave the
        outcome unknown and looking for the run id did not settle it.
        """
        from pyiceberg.exceptions import CommitFailedException

        props = {
            WATERMARK: str(plan.to_snapshot_inclusive),
            SEQUENCE: "none" if plan.to_sequence_number is None else str(plan.to_sequence_number),
            FROM_SNAPSHOT: "none" if plan.from_snapshot_exclusive is None else str(plan.from_snapshot_exclusive),
            SOURCE_TABLE: plan.source_table,
            CONSUMER: plan.consumer,
            RUN_ID: plan.run_id,
            **totals.summary(),
        }
        last_error: Exception | None = None
        for attempt in range(1, max_attempts + 1):
            table = self.results()
            if table is None:
                raise TableNotFoundError(
                    f"results table {self.results_table!r} disappeared during the run; rerun the job"
                )
            done = find_run(table.metadata, plan.run_id)
            if done is not None:
                return CommitResult(done.ledger_snapshot_id, attempt, already_committed=True)
            current = read_watermark(table.metadata, self.source_table)
            if current.source_snapshot_id != plan.from_snapshot_exclusive:
                self.discard(data_files)
                raise WatermarkConflictError(
                    f"run {plan.run_id} planned from watermark {plan.from_snapshot_exclusive} but run "
                    f"{current.run_id} moved it to {current.source_snapshot_id} first; this run's "
                    f"{totals.rows} result rows were discarded (they are already covered)"
                )
            txn = table.transaction()
            with txn.update_snapshot(snapshot_properties=props).fast_append() as append:
                for data_file in data_files:
                    append.append_data_file(data_file)
            try:
                txn.commit_transaction()
            except CommitFailedException as e:
                log.info("ledger commit attempt %d lost a race (%s); re-checking the watermark", attempt, e)
                last_error = e
                continue
            except Exception as e:  # outcome unknown: the catalog may or may not have applied it
                log.warning("ledger commit attempt %d failed with an unknown outcome: %r", attempt, e)
                last_error = e
                time.sleep(min(0.2 * 2**attempt, 5.0))
                continue
            landed = self.find_run(plan.run_id)
            if landed is None:  # pragma: no cover - a catalog that acknowledges and loses a commit
                raise CommitOutcomeUnknownError(f"commit of run {plan.run_id} acknowledged but not visible")
            log.info(
                "ledger commit: run %s, watermark %s -> %s, %d rows (ledger snapshot %d)",
                plan.run_id,
                plan.from_snapshot_exclusive,
                plan.to_snapshot_inclusive,
                totals.rows,
                landed.ledger_snapshot_id,
            )
            return CommitResult(landed.ledger_snapshot_id, attempt)
        landed = self.find_run(plan.run_id)
        if landed is not None:
            return CommitResult(landed.ledger_snapshot_id, max_attempts, already_committed=True)
        raise CommitOutcomeUnknownError(
            f"could not commit run {plan.run_id} after {max_attempts} attempts (last error: {last_error!r}); "
            "its range is still pending and will be processed again by the next run"
        ) from last_error

    def reset(self, to_snapshot_id: int | None, *, reason: str) -> int:
        """Record a new watermark without results (operator action after a rollback/expiry)."""
        table = self.results()
        if table is None:
            raise TableNotFoundError(
                f"results table {self.results_table!r} does not exist yet: run the job once (or "
                "`icebatch job run --limit 1`) before moving its watermark"
            )
        target = self.source().metadata.snapshot_by_id(to_snapshot_id) if to_snapshot_id is not None else None
        seq = target.sequence_number if target is not None else None
        props = {
            WATERMARK: "none" if to_snapshot_id is None else str(to_snapshot_id),
            SEQUENCE: "none" if seq is None else str(seq),
            FROM_SNAPSHOT: "none",
            SOURCE_TABLE: self.source_table,
            CONSUMER: self.consumer,
            RUN_ID: f"reset-{int(time.time())}",
            PREFIX + "reset-reason": reason,
        }
        txn = table.transaction()
        with txn.update_snapshot(snapshot_properties=props).fast_append():
            pass
        txn.commit_transaction()
        refreshed = self.results()
        assert refreshed is not None and refreshed.metadata.current_snapshot_id is not None
        return refreshed.metadata.current_snapshot_id

    def discard(self, data_files: Sequence[DataFile]) -> None:
        """Delete data files of a run that will not be committed (best effort: orphans are harmless)."""
        table = self.results()
        if table is None:
            return
        for f in data_files:
            try:
                table.io.delete(f.file_path)
            except OSError as e:
                log.warning("could not delete discarded data file %s: %s", f.file_path, e)


def open_ledger(settings: Settings, *, control_plane: bool = False) -> ResultsLedger:
    """The ledger of the configured consumer (``control_plane=True``: metadata reads without pyarrow)."""
    catalog = open_catalog(settings, control_plane=control_plane)
    return ResultsLedger(catalog, settings.source_table, settings.results_table, settings.consumer)
