"""Reading exactly the rows of a pinned range, (from_snapshot_exclusive, to_snapshot_inclusive], not yet done.

Planning happens once, here on the driver (pyiceberg's ``incremental_append_scan``: it reads manifest
lists, never data files; Ray's own ``read_iceberg`` has no incremental option). Every row read carries
its name: the data file it comes from and its position in that file (``SOURCE_FILE``/``SOURCE_POS``);
rows a ``DoneRows`` names are skipped. Two forms over the same planned files, both streaming:

- ``iter_batches``: Arrow tables in this process.
- ``read_dataset``: a Ray dataset whose read tasks each scan a share of the planned files.

A read task carries its files (paths, row counts, the positions already done) and what reading them needs
of the table's metadata (schemas, partition specs, the name mapping, the format version), never the
table's history: a streaming-fed source commits thousands of snapshots a day, and a task that carried them
would grow with every one (past Ray's 1 MiB read-task limit at about 3,000).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray.data
from icebatch.core.errors import WatermarkError
from icebatch.core.failpoints import arm, failpoint
from icebatch.core.ledger import RunPlan
from icebatch.core.ledger.lineage import ancestry
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from icebatch_job.columns import SOURCE_FILE, SOURCE_HASH, SOURCE_POS
from icebatch_job.commit.done import DoneRows
from icebatch_job.plan.deletes import plan_files
from icebatch_job.plan.id_bounds import judge
from icebatch_job.plan.identity import content_hashes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask, Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot

_INFLATION = 5  # Parquet on disk -> Arrow in memory, a rough planning factor


@dataclass(frozen=True)
class Failpoint:
    """The job's failpoint, handed to its read tasks (they run in other processes)."""

    spec: str | None
    home: Path


@dataclass(frozen=True)
class PlannedRange:
    """The source data files of a pinned range, in a fixed order (path), and what to read of them."""

    tasks: tuple[FileScanTask, ...]
    schema: Any  # the projected pyiceberg schema
    metadata: Any  # ``read_metadata``: without the history
    io: Any
    content: tuple[str, ...] = ()  # the columns a row's ``SOURCE_HASH`` is of, in order (the id first)
    rewrites: bool = False  # its rows are matched by content (``identity``): it rewrote rows, or may repeat ids
    deleted: DoneRows = field(default_factory=DoneRows)  # rows of its files that position deletes remove
    deletes: bool = False  # rows may have been deleted in it: verdicts of ids gone are looked for (``removals``)
    id_record: str | None = None  # the ids' upper bound up to its end, for its watermark commit (``id_bounds``)
    ids_may_repeat: bool = False  # appends only, whose ids are not all past those seen: ``identity.repeats`` looks
    whole: bool = False  # every row live at its end (a first run): its rows repeat no verdict, only one another

    @property
    def rows(self) -> int:
        """Source rows the range holds: its files' rows less those position deletes remove."""
        return sum(t.file.record_count for t in self.tasks) - len(self.deleted)


def read_metadata(metadata: TableMetadata) -> TableMetadata:
    """What reading a planned file needs of the table's metadata: everything but the history (snapshots, their
    logs, refs and statistics), whose size grows with every commit to the table."""
    return metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
        }
    )


def plan_range(table: Table, plan: RunPlan, columns: tuple[str, ...] | None = None) -> PlannedRange:
    """The range's files; ``columns`` are the task's names for them (default: every column). A column the
    source renamed since the task was written is read under its name now and handed on under the task's
    (``RunPlan.source_columns``: the ledger follows columns by field id)."""
    renamed = plan.source_columns.renamed if plan.source_columns else {}
    to_source = {task_name: source_name for source_name, task_name in renamed.items()}
    scan = table.incremental_append_scan(  # its projection; its planning walks the history quadratically
        from_snapshot_id_exclusive=plan.scan_from_exclusive,
        to_snapshot_id_inclusive=plan.to_snapshot_inclusive,
        selected_fields=tuple(to_source.get(c, c) for c in columns) if columns else ("*",),
    )
    span = range_snapshots(
        table.metadata,
        plan.scan_from_exclusive,
        plan.to_snapshot_inclusive,
        from_sequence=plan.from_sequence_number,
        first_run=plan.from_snapshot_exclusive is None,
        watermark=plan.from_snapshot_exclusive,
    )
    end = table.metadata.snapshot_by_id(plan.to_snapshot_inclusive)
    assert end is not None
    taken, manifests = _range_manifests(table, span, end)
    tasks, deleted = plan_files(table.metadata, table.io, manifests, taken)  # merge-on-read deletes applied
    schema = _named(scan.projection(), renamed)
    content = tuple(columns) if columns else tuple(f.name for f in schema.fields)
    # a first run matches nothing, unless a run closed part way left verdicts of the range (``RunPlan.match_content``)
    deletes = plan.match_content or ((span.rewrites or span.past_sequence is not None) and not span.whole)
    ids = (
        judge(table, end, to_source.get(content[0], content[0]), tasks, plan.source_id_upper, taken)
        if columns
        else None
    )
    # an append-only range whose ids are not all new by their bounds may repeat ids (a writer's retry), and a first
    # run's rows may repeat one another's: the job looks (``identity.repeats``)
    may_repeat = ids is not None and (span.whole or not ids.new_ids_only) and not deletes
    return PlannedRange(
        tuple(tasks),
        schema,
        read_metadata(table.metadata),
        table.io,
        content,
        deletes,
        deleted,
        deletes,
        ids.record if ids else None,
        may_repeat,
        span.whole,
    )


def _range_manifests(table: Table, span: RangeSnapshots, end: Snapshot) -> tuple[Callable[[Any], bool], list[Any]]:
    """Where a range's files are listed: which manifest entries are the range's data files (delete files are
    always taken: they may apply to them), and the manifests to read."""
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

    live = (ManifestEntryStatus.ADDED, ManifestEntryStatus.EXISTING)
    if span.whole:  # a first run: every row live at the end (its history may have been expired in part)
        return lambda e: e.status in live, list(end.manifests(table.io))
    if span.past_sequence is not None or span.rewrites:
        # Snapshots after the watermark expired unprocessed: the files live at the end whose data sequence number
        # is past the watermark's hold their rows. Rows deleted or rewritten in the range (copy-on-write): the
        # rows live at the end in files the range added, whatever operation added them. Either way copies of
        # labelled rows are among them, which ``identity`` tells from new and changed ones.
        past, ids = span.past_sequence, span.ids

        def taken(e: Any) -> bool:
            if e.data_file.content != DataFileContent.DATA:
                return e.status in live
            return e.status in live and ((e.sequence_number or 0) > past if past is not None else e.snapshot_id in ids)

        return taken, list(end.manifests(table.io))
    appended = {s.snapshot_id for s in span.appends}
    if span.appends_only and span.first_sequence is not None:
        # Nothing was removed in the range, so every file it added is live at its end: the end's manifests list
        # them (ADDED there, or EXISTING once a later append merged manifests), and only manifests written in
        # the range can: one manifest list is read, not one per snapshot.
        first = span.first_sequence
        manifests = [
            m for m in end.manifests(table.io) if m.content == ManifestContent.DATA and m.sequence_number >= first
        ]
        return lambda e: e.snapshot_id in appended and e.status in live, manifests
    # pyiceberg's incremental append scan: each append snapshot's own manifests, its ADDED entries
    manifests = [
        m
        for s in span.appends
        for m in s.manifests(table.io)
        if m.content == ManifestContent.DATA and m.added_snapshot_id in appended
    ]
    return lambda e: e.snapshot_id in appended and e.status == ManifestEntryStatus.ADDED, list(set(manifests))


@dataclass(frozen=True)
class RangeSnapshots:
    appends: list[Snapshot]  # newest first: the snapshots whose added files the range holds
    appends_only: bool  # no other operation in the range: nothing was removed in it
    first_sequence: int | None  # the oldest snapshot's sequence number (None: format v1, or unknown)
    ids: frozenset[int] = frozenset()  # every snapshot of the range
    rewrites: bool = False  # a ``delete`` or ``overwrite`` in the range: rows were deleted or rewritten
    past_sequence: int | None = None  # snapshots after the watermark expired: its sequence number
    whole: bool = False  # no watermark: the range is every row live at its end


def range_snapshots(
    meta: TableMetadata,
    from_exclusive: int | None,
    to_inclusive: int,
    *,
    from_sequence: int | None = None,
    first_run: bool = False,
    watermark: int | None = None,
) -> RangeSnapshots:
    """The snapshots after ``from_exclusive`` up to ``to_inclusive`` along its ancestry, in one walk
    (``ledger.lineage.ancestry``): the ``append`` ones, which pyiceberg's incremental append scan reads, found
    without its walks that look every parent up in the whole snapshot list (quadratic in the history: a
    streaming-fed source has thousands of snapshots a day). ``from_exclusive`` may be expired, as there: it must
    then be the parent of one of the range's snapshots. ``from_sequence``: the watermark's sequence number; when
    the oldest snapshot found does not follow it, snapshots between were expired (``past_sequence``).
    ``first_run``: there is no watermark, and the range is every row live at its end (``whole``), whichever
    snapshots of its history are left. ``watermark``: on format v1 (no sequence numbers), an expired watermark
    the range does not start from means its history was cut: every row live at the end, matched by content."""
    from pyiceberg.table.snapshots import Operation

    end = meta.snapshot_by_id(to_inclusive)
    if end is None:
        raise WatermarkError(f"snapshot {to_inclusive} is not in the source table's metadata (expired?)")
    appends: list[Snapshot] = []
    only, first, rewrites, ids = True, None, False, set()
    for snapshot in ancestry(end, meta):
        if from_exclusive is not None and snapshot.snapshot_id == from_exclusive:
            break
        first = snapshot.sequence_number
        ids.add(snapshot.snapshot_id)
        operation = snapshot.summary.operation if snapshot.summary is not None else Operation.APPEND
        if operation == Operation.APPEND:
            appends.append(snapshot)
        else:
            only = False
            rewrites = rewrites or operation in (Operation.DELETE, Operation.OVERWRITE)
        if from_exclusive is not None and snapshot.parent_snapshot_id == from_exclusive:
            break
    else:
        if from_exclusive is not None:
            raise WatermarkError(
                f"snapshot {from_exclusive} is not in the history of snapshot {to_inclusive}: the range cannot be read"
            )
    usable = meta.format_version >= 2 and first is not None and first > 0
    # (an expiry clears the parent id of the oldest snapshot it keeps: the walk then starts the range from None)
    expired = from_exclusive is None or meta.snapshot_by_id(from_exclusive) is None
    gap = usable and expired and from_sequence is not None and first != from_sequence + 1
    past = from_sequence if gap else None
    cut = watermark is not None and watermark != from_exclusive and meta.snapshot_by_id(watermark) is None
    if meta.format_version < 2 and cut:
        gap, past = True, -1  # the history was cut past an expired watermark: every live row
    first = first if usable else None
    return RangeSnapshots(appends, only and not gap, first, frozenset(ids), rewrites, past, whole=first_run)


def _named(projection: Schema, renamed: dict[str, str]) -> Schema:
    """The projection with the task's names (files are read by field id, so the names are the output's only)."""
    if not renamed:
        return projection
    from pyiceberg.schema import Schema

    fields = [f.model_copy(update={"name": renamed.get(f.name, f.name)}) for f in projection.fields]
    return Schema(*fields, schema_id=projection.schema_id, identifier_field_ids=projection.identifier_field_ids)


def _read_files(
    tasks: Iterable[FileScanTask],
    metadata: Any,
    io: Any,
    schema: Any,
    done: DoneRows,
    content: tuple[str, ...],
    fp: Failpoint | None = None,
) -> Iterable[pa.Table]:
    """Each file's rows in file order, with their names and content hashes, less the rows already done."""
    import numpy as np
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow

    if fp is not None:
        arm(fp.spec, fp.home)
    target = schema_to_pyarrow(schema, include_field_ids=False)
    scan = ArrowScan(table_metadata=metadata, io=io, row_filter=AlwaysTrue(), projected_schema=schema)
    for task in tasks:
        failpoint("read")
        path = task.file.file_path
        skip = done.positions(path)
        start = 0
        for batch in scan.to_record_batches(tasks=(task,)):
            positions = np.arange(start, start + batch.num_rows, dtype=np.int64)
            start += batch.num_rows
            rows = pa.Table.from_batches([batch]).cast(target)
            if content:  # () when only the ids are read (``work.repeats``)
                rows = rows.append_column(SOURCE_HASH, content_hashes(rows.select(list(content))))
            rows = rows.append_column(SOURCE_FILE, pa.array([path] * len(positions), pa.string()))
            rows = rows.append_column(SOURCE_POS, pa.array(positions))
            if skip is not None:
                rows = rows.filter(pa.array(~np.isin(positions, skip)))
            if rows.num_rows:
                yield rows
        if start != task.file.record_count:
            raise RuntimeError(f"{path} yielded {start} rows, its manifest says {task.file.record_count}")


def iter_batches(
    table: Table, plan: RunPlan, columns: tuple[str, ...] | None = None, *, done: DoneRows | None = None
) -> Iterator[pa.Table]:
    """The range's rows not yet done, as Arrow tables, one file at a time, in this process."""
    planned = plan_range(table, plan, columns)
    yield from read_rows(planned, done or DoneRows())


def read_rows(planned: PlannedRange, done: DoneRows) -> Iterable[pa.Table]:
    """The planned files' rows not done (nor deleted), in this process."""
    skip = done.union(planned.deleted) if len(planned.deleted) else done
    return _read_files(planned.tasks, planned.metadata, planned.io, planned.schema, skip, planned.content)


READ_CONCURRENCY = 2


def read_dataset(
    planned: PlannedRange,
    done: DoneRows,
    *,
    parallelism: int = -1,
    num_cpus: float = 0.25,
    concurrency: int = READ_CONCURRENCY,
    fp: Failpoint | None = None,
) -> ray.data.Dataset:
    """The range's rows not yet done, as a streaming Ray dataset.

    Read tasks ask for a fraction of a CPU: they are I/O-bound, and a whole CPU each can leave nothing for
    the engine's bundle on a small node. Few run at once (``concurrency``): one Parquet reader outpaces a
    GPU's generation by orders of magnitude, and each extra reader is another Ray worker process starting
    (importing pyarrow and pyiceberg) while the engine starts.
    """
    source = IncrementalIcebergDatasource(planned, done.union(planned.deleted) if len(planned.deleted) else done, fp)
    # never more than there are read tasks: Ray warns about a limit the read cannot reach
    tasks = source.file_count if parallelism < 1 else min(parallelism, source.file_count)
    readers = max(1, min(concurrency, tasks))
    return ray.data.read_datasource(source, override_num_blocks=parallelism, num_cpus=num_cpus, concurrency=readers)


def _read_task_fn(
    tasks: list[FileScanTask],
    metadata: Any,
    io: Any,
    schema: Any,
    done: DoneRows,
    content: tuple[str, ...],
    fp: Failpoint | None,
) -> Callable[[], Iterable[pa.Table]]:
    """A read task's function: a named one (Ray names a large read task by its function's ``__name__``,
    which a ``functools.partial`` does not have: its warning then fails the read)."""

    def read_iceberg_files() -> Iterable[pa.Table]:
        return _read_files(tasks, metadata, io, schema, done, content, fp)

    return read_iceberg_files


class IncrementalIcebergDatasource(Datasource):
    """Ray datasource over the files an incremental append scan planned, less the rows already done."""

    def __init__(self, planned: PlannedRange, done: DoneRows, fp: Failpoint | None = None) -> None:
        super().__init__()
        self._planned = planned
        self._done = done
        self._fp = fp

    @property
    def file_count(self) -> int:
        return len(self._planned.tasks)

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(t.file.file_size_in_bytes for t in self._planned.tasks) * _INFLATION

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        p = self._planned
        if not p.tasks:
            return []
        n = max(1, min(parallelism, len(p.tasks)))
        shares: list[list[FileScanTask]] = [[] for _ in range(n)]
        for i, task in enumerate(p.tasks):
            shares[i % n].append(task)
        arrow_schema = (
            schema_to_pyarrow(p.schema, include_field_ids=False)
            .append(pa.field(SOURCE_HASH, pa.int64()))
            .append(pa.field(SOURCE_FILE, pa.string()))
            .append(pa.field(SOURCE_POS, pa.int64()))
        )
        read_tasks = []
        for share in shares:
            paths = [t.file.file_path for t in share]
            done = self._done.only(paths)
            meta = BlockMetadata(
                num_rows=sum(t.file.record_count for t in share) - len(done),
                size_bytes=sum(t.file.file_size_in_bytes for t in share) * _INFLATION,
                input_files=tuple(paths),
                exec_stats=None,
            )
            read_tasks.append(
                ReadTask(
                    _read_task_fn(share, p.metadata, p.io, p.schema, done, p.content, self._fp),
                    meta,
                    schema=arrow_schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return read_tasks
