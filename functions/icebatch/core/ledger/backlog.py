"""The backlog: what is new for a consumer since its watermark, from the source table's metadata only.

What each snapshot operation means for the backlog:

- ``append``: its rows are new (``added-records`` from the summary; the manifest list when a writer
  left the summary incomplete). Data files are never opened.
- ``replace`` (compaction): adds no new rows; skipped.
- ``overwrite`` (MERGE/UPDATE, dynamic partition overwrite, a copy-on-write delete) and ``delete``: its
  added rows are counted in ``Backlog.skipped_rows``, not as new: most are copies of rows already there. A
  run over a range holding one reads the rows it left by content (``icebatch_job.plan.identity``): a copy of a
  labelled row is not labelled again, a changed or new one is, and verdicts of deleted rows are removed.

If the watermark is no longer in the history of the source table's current snapshot (rolled back, or
expired together with all its descendants' parents), the backlog cannot be computed safely: a
``WatermarkError`` says so and names the fix (``icebatch ledger reset``), instead of silently
reprocessing or skipping rows. A watermark snapshot that was merely expired is fine as long as it is the
parent of a snapshot that still exists, and so is a watermark kept while a snapshot after it was expired out of
order (the rows past its sequence number are then read matched by content).

A watermark is a position in one table's history: the ledger records the source table's UUID with every
commit, and a table of the same name with another UUID (dropped and created again, or a catalog entry
pointed elsewhere) is never read as a continuation (``same_table``: ``SourceReplacedError``). Its
snapshot ids and sequence numbers start over and would mean nothing against the old watermark.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from icebatch.core.errors import SourceReplacedError, WatermarkError
from icebatch.core.ledger.lineage import ancestry

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot


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
    deleted_rows: int = 0  # rows deleted in the range, net of rewrites, plus delete-file rows
    # a ``delete`` or ``overwrite`` in the range, or a watermark recorded by closing a run part way (its verdicts
    # stand: the next run matches by content and removes those of rows deleted since): a run, even with no new rows
    rewrites: bool = False
    gap: bool = False  # snapshots after the watermark were expired unprocessed: ``rows`` are those of live files
    # whose data sequence number is past the watermark's (copies of labelled rows among them are not sent again)

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
            "deleted_rows": self.deleted_rows,
            "history_gap": self.gap,
        }


def added_rows(snap: Snapshot, io: FileIO) -> int:
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


def same_table(
    recorded_uuid: str | None, recorded_at: int | None, meta: TableMetadata, *, source_table: str, consumer: str
) -> None:
    """Refuse a source that is not the table the ledger follows (``recorded_uuid``; None: commits that
    predate the check, which record no table)."""
    current = str(meta.table_uuid)
    if recorded_uuid is None or recorded_uuid == current:
        return
    raise SourceReplacedError(
        f"consumer {consumer!r} follows {source_table!r} with table UUID {recorded_uuid} (ledger snapshot "
        f"{recorded_at}), but {source_table!r} is now the table with UUID {current}: dropped and created again, or "
        "its catalog entry points at another table. Its snapshots are not a continuation of the watermark, and "
        f"nothing is launched for it. Fix: `icebatch ledger reset --consumer {consumer} --to-snapshot none "
        "--new-source keep-results|drop-results --reason ...` labels the new table from its start, keeping or "
        "deleting the old table's verdicts"
    )


def _pending_snapshots(
    meta: TableMetadata, watermark: int | None, watermark_seq: int | None, upto: int | None
) -> tuple[list[Snapshot], bool]:
    """Snapshots after the watermark up to ``upto`` (default: current), oldest first, and whether snapshots
    between the watermark and them were expired (a gap).

    The watermark is found in the ancestry of ``upto``. If it was expired, the ancestry is cut by its
    sequence number instead (recorded in the ledger; sequence numbers only grow). When the oldest remaining
    snapshot does not directly follow it, snapshots after the watermark were expired before being processed:
    their rows are found by the data sequence numbers of the files live now (format v2 and later), which
    a run reads matched by content (``Backlog.gap``).
    """
    end = meta.snapshot_by_id(upto) if upto is not None else meta.current_snapshot()
    if upto is not None and end is None:
        raise WatermarkError(
            f"snapshot {upto} is not in the source table's metadata (expired?): a run part way through a range "
            f"ending there cannot go on. {_RESET_FIX}"
        )
    if end is None:
        return [], False
    history = list(ancestry(end, meta))  # newest first
    if watermark is None:  # a history whose oldest left is not the table's first (sequence 1) was expired in part
        return history[::-1], meta.format_version >= 2 and (history[-1].sequence_number or 0) > 1
    ids = [s.snapshot_id for s in history]
    if watermark in ids:
        return history[: ids.index(watermark)][::-1], False
    if (at := meta.snapshot_by_id(watermark)) is not None:
        after = _past_kept_watermark(meta, history, at)
        return after, bool(after)
    last_seq = getattr(meta, "last_sequence_number", None)  # format v2 and later
    if watermark_seq is not None and last_seq is not None and watermark_seq > last_seq:
        raise WatermarkError(
            f"the last processed snapshot {watermark} has sequence number {watermark_seq}, past this table's last "
            f"({last_seq}): it is not of this table's history (replaced?). {_RESET_FIX}"
        )
    if meta.format_version < 2:
        return _past_expired_on_v1(history, watermark)
    if watermark_seq is None:
        raise WatermarkError(
            f"the last processed snapshot {watermark} was expired and the ledger holds no sequence number "
            f"to continue from. {_RESET_FIX}"
        )
    pending = [s for s in history if (s.sequence_number or 0) > watermark_seq][::-1]
    kept = [s for s in history if (s.sequence_number or 0) <= watermark_seq]
    return pending, bool(pending and not kept and (pending[0].sequence_number or 0) != watermark_seq + 1)


def _past_expired_on_v1(history: list[Snapshot], watermark: int) -> tuple[list[Snapshot], bool]:
    """After an expired watermark on a format-v1 table, which has no sequence numbers: a kept snapshot whose parent
    is the watermark (Iceberg Java keeps parent ids) starts the range as usual; otherwise the history is cut and
    nothing tells the files added before the watermark from those added after, so every row live now is the range,
    matched by content (a gap: rows labelled already are not sent again, verdicts of rows gone are removed)."""
    for i, snapshot in enumerate(history):  # newest first
        if snapshot.parent_snapshot_id == watermark:
            return history[: i + 1][::-1], False
    return history[::-1], True


def watermark_sequence(meta: TableMetadata, watermark: int | None, recorded: int | None) -> int | None:
    """The watermark's sequence number: as the ledger recorded it, or else (commits that predate it) the snapshot's."""
    if recorded is not None or watermark is None:
        return recorded
    kept = meta.snapshot_by_id(watermark)
    return kept.sequence_number if kept is not None else None


def _past_kept_watermark(meta: TableMetadata, history: list[Snapshot], watermark: Snapshot) -> list[Snapshot]:
    """The snapshots after a watermark that is still in the metadata but not in the history of now: the table was
    rolled back past it, or a snapshot between them was expired out of order (Spark's ``expire_snapshots`` given
    snapshot ids, a retention that keeps tagged snapshots), which cuts the history short of the watermark.

    An ancestor of the oldest snapshot left, ``O``, is older than ``O``'s expired parent: the watermark can be one
    only where the history is cut (``O`` has a parent, or pyiceberg's expiry cleared it: a sequence number past the
    table's first) and ``O`` is at least two sequence numbers past it. Then the rows past the watermark's sequence
    number are read matched by content, as after any expiry (a gap); otherwise it was rolled back past."""
    oldest = history[-1]
    seq, first = watermark.sequence_number or 0, oldest.sequence_number or 0
    cut = oldest.parent_snapshot_id is not None or first > 1
    if meta.format_version < 2 or not cut or first < seq + 2:
        raise WatermarkError(
            f"the last processed snapshot {watermark.snapshot_id} is not in the history of snapshot "
            f"{history[0].snapshot_id}: the source table was rolled back past it. {_RESET_FIX}"
        )
    return [s for s in history if (s.sequence_number or 0) > seq][::-1]


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

    watermark_seq = watermark_sequence(source_meta, watermark, watermark_seq)
    pending, gap = _pending_snapshots(source_meta, watermark, watermark_seq, upto)
    rows = 0
    ids: list[int] = []
    per: list[int] = []
    oldest: int | None = None
    skipped: list[SkippedSnapshot] = []
    deleted, rewrites = 0, False
    for snap in pending:
        op = snap.summary.operation if snap.summary is not None else Operation.APPEND
        if op == Operation.APPEND or (op == Operation.OVERWRITE and _row_delta(snap)):
            added = added_rows(snap, io)
            rows += added
            ids.append(snap.snapshot_id)
            per.append(added)
            if oldest is None and added > 0:
                oldest = snap.timestamp_ms
        elif op == Operation.OVERWRITE:
            skipped.append(SkippedSnapshot(snap.snapshot_id, op.value, added_rows(snap, io)))
        if op in (Operation.DELETE, Operation.OVERWRITE):  # a copy-on-write rewrite re-adds the rows it keeps
            rewrites = True
            deleted += max(0, _count(snap, "deleted-records") - _count(snap, "added-records"))
            deleted += _count(snap, "added-position-deletes") + _count(snap, "added-equality-deletes")
    current = pending[-1].snapshot_id if pending else (upto if upto is not None else source_meta.current_snapshot_id)
    if gap:  # the rows of the expired snapshots are in live files past the watermark's sequence number
        assert pending
        v1 = source_meta.format_version < 2  # no sequence numbers: every live row, matched by content
        rows = _rows_past(pending[-1], io, -1 if v1 else watermark_seq or 0)
        rewrites = v1 or watermark_seq is not None
        ids, per = [pending[-1].snapshot_id], [rows]
        oldest = pending[0].timestamp_ms  # at the latest: the expired snapshots' rows are older
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
        deleted_rows=deleted,
        rewrites=rewrites,
        gap=gap,
    )


def _rows_past(end: Snapshot, io: FileIO, sequence: int) -> int:
    """Rows of the data files live at ``end`` whose data sequence number is past ``sequence`` (manifests only)."""
    from pyiceberg.manifest import ManifestContent

    return sum(
        e.data_file.record_count
        for m in end.manifests(io)
        if m.content == ManifestContent.DATA
        for e in m.fetch_manifest_entry(io, discard_deleted=True)
        if (e.sequence_number or 0) > sequence
    )


def _row_delta(snap: Snapshot) -> bool:
    """An ``overwrite`` that removed no data file: a merge-on-read row delta (Flink's and Kafka Connect's upserts,
    Spark's merge-on-read UPDATE and MERGE), whose added rows are new versions, not copies: backlog rows (a version
    whose content has a verdict already is not sent again: ``icebatch_job.plan.identity``)."""
    return _count(snap, "deleted-data-files") == 0 and _count(snap, "added-data-files") > 0


def _count(snap: Snapshot, key: str) -> int:
    """A count from a snapshot's summary (0 when a writer left it out or wrote something else)."""
    value = snap.summary.get(key) if snap.summary is not None else None
    return int(value) if value is not None and value.isdigit() else 0


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
