"""A long table history in seconds: snapshots written into the metadata directly, as a streaming writer leaves them.

A table fed by Flink or Kafka Connect commits every checkpoint, whether or not rows arrived: thousands of
snapshots a day, most adding little or nothing. Appending them one by one through pyiceberg takes minutes
per thousand (its metadata is rewritten and copied on every commit). Here ``n`` snapshots are added in one
metadata commit: each is an ``append`` of no rows whose manifest list keeps the table's live manifests (one
list file, shared), so the table's rows, its readers and its metadata are what such a history leaves; only
the snapshots carry no rows of their own. Catalogs that can register a table's metadata (SQL) only.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyiceberg.manifest import write_manifest_list
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

if TYPE_CHECKING:
    import pyarrow as pa


def add_empty_appends(
    table: Table, n: int, *, seed: int = 0, every_ms: int = 60_000, distinct_lists: bool = False
) -> list[int]:
    """Commit ``n`` snapshots that add no rows after the table's current one; returns their ids, oldest first.

    ``distinct_lists``: each snapshot gets a manifest list file of its own, as a real writer leaves them (a reader
    that opens every snapshot's list pays for each; about 0.35 ms a list to write here), instead of one shared.
    """
    meta = table.metadata
    parent = meta.current_snapshot()
    manifests = parent.manifests(table.io) if parent is not None else []
    rng = random.Random(seed)
    ids = [rng.randrange(1, 2**62) for _ in range(n)]
    first_seq = meta.next_sequence_number()
    previous = parent.snapshot_id if parent else None
    shared = _manifest_list(table, manifests, ids[0], previous, first_seq) if not distinct_lists else None
    start_ms = (parent.timestamp_ms if parent else meta.last_updated_ms) + every_ms
    snapshots = []
    for i, sid in enumerate(ids):
        snapshots.append(
            Snapshot(
                snapshot_id=sid,
                parent_snapshot_id=previous,
                sequence_number=first_seq + i if meta.format_version >= 2 else None,
                timestamp_ms=start_ms + i * every_ms,
                manifest_list=shared or _manifest_list(table, manifests, sid, previous, first_seq + i),
                summary=Summary(Operation.APPEND, **{"added-records": "0", "added-data-files": "0"}),
                schema_id=meta.current_schema_id,
            )
        )
        previous = sid
    _commit_history(table, snapshots)
    return ids


def _commit_history(table: Table, snapshots: list[Snapshot]) -> None:
    """The table's metadata with ``snapshots`` after its current one, written and registered in one step (one copy
    of the metadata: adding them as updates copies the snapshot list once each, quadratic at 100,000)."""
    from pyiceberg.table.refs import SnapshotRef
    from pyiceberg.table.snapshots import SnapshotLogEntry

    meta = table.metadata
    last = snapshots[-1]
    update: dict = {
        "snapshots": [*meta.snapshots, *snapshots],
        "snapshot_log": [
            *meta.snapshot_log,
            *(SnapshotLogEntry(snapshot_id=s.snapshot_id, timestamp_ms=s.timestamp_ms) for s in snapshots),
        ],
        "refs": {
            **meta.refs,
            MAIN_BRANCH: SnapshotRef(snapshot_id=last.snapshot_id, snapshot_ref_type=SnapshotRefType.BRANCH),
        },
        "current_snapshot_id": last.snapshot_id,
        "last_updated_ms": last.timestamp_ms,
    }
    if meta.format_version >= 2:
        update["last_sequence_number"] = last.sequence_number
    _register(table, meta.model_copy(update=update))


def expire_as_iceberg_java(table: Table, snapshot_ids: list[int]) -> None:
    """Iceberg Java's (Spark's ``expire_snapshots(snapshot_ids => ...)``) expiry of these snapshots: gone from the
    metadata and its snapshot log, their children keeping their parent ids (pyiceberg's expiry clears them)."""
    gone = set(snapshot_ids)
    meta = table.metadata
    update = {
        "snapshots": [s for s in meta.snapshots if s.snapshot_id not in gone],
        "snapshot_log": [e for e in meta.snapshot_log if e.snapshot_id not in gone],
    }
    _register(table, meta.model_copy(update=update))


def _register(table: Table, crafted: Any) -> None:
    """``crafted`` metadata written and registered as the table's (one step, no update copies)."""
    from pyiceberg.serializers import ToOutputFile

    path = f"{crafted.location}/metadata/{uuid.uuid4()}-crafted.metadata.json"
    ToOutputFile.table_metadata(crafted, table.io.new_output(path))
    table.catalog.drop_table(table.name())  # the entry only: the files stay (the SQL catalog cannot overwrite one)
    table.catalog.register_table(table.name(), path)


def _manifest_list(table: Table, manifests: list, snapshot_id: int, parent: int | None, sequence: int) -> str:
    meta = table.metadata
    path = f"{meta.location}/metadata/snap-crafted-{snapshot_id}-{uuid.uuid4()}.avro"
    with write_manifest_list(
        format_version=meta.format_version,
        output_file=table.io.new_output(path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent,
        sequence_number=sequence,
        avro_compression="deflate",
    ) as writer:
        writer.add_manifests(manifests)
    return path


def add_position_deletes(table: Table, deletes: dict[str, list[int]], *, delete_format: str = "PARQUET") -> int:
    """Commit a merge-on-read ``delete`` as Spark leaves one (``write.delete.mode=merge-on-read``): one position
    delete file (``file_path``, ``pos``) naming rows of live data files, in a delete manifest of its own; the data
    files stay. pyiceberg writes no delete files, so the file, its manifest and the snapshot are written here
    (the snapshot through pyiceberg's own producer). Returns the snapshot id."""
    import pyarrow as pa
    from pyiceberg.manifest import DataFileContent

    rows = pa.table(
        {
            "file_path": pa.array([p for p, ps in deletes.items() for _ in ps], pa.string()),
            "pos": pa.array([x for ps in deletes.values() for x in sorted(ps)], pa.int64()),
        },
        schema=pa.schema(
            [
                pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": "2147483546"}),
                pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": "2147483545"}),
            ]
        ),
    )
    delete_file = _delete_file(table, rows, DataFileContent.POSITION_DELETES, file_format=delete_format)
    return commit_delete_files(table, [delete_file], Operation.DELETE)


def upsert_with_equality_deletes(table: Table, rows: pa.Table, key: str, *, delete_format: str = "PARQUET") -> int:
    """Commit ``rows`` as Flink's upsert mode (and Kafka Connect's) commits a checkpoint: one ``overwrite`` snapshot
    holding a data file of the rows and an equality delete file of their ``key`` values (one per row, whether the key
    existed or not). The delete file's sequence number is the snapshot's, so it removes older versions of the keys,
    never the rows written beside it. With no ``rows`` columns but ``key``: a delete (a ``delete`` snapshot of the
    delete file alone). ``delete_format``: the delete file's (``write.delete.format.default``: PARQUET, ORC, AVRO).
    Returns the snapshot id."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.manifest import DataFileContent

    field = table.schema().find_field(key)
    key_field = pa.field(key, rows.schema.field(key).type, metadata={"PARQUET:field_id": str(field.field_id)})
    keys = pa.table({key: rows.column(key)}).cast(pa.schema([key_field]))
    delete_file = _delete_file(
        table, keys, DataFileContent.EQUALITY_DELETES, equality_ids=[field.field_id], file_format=delete_format
    )
    if rows.column_names == [key]:
        return commit_delete_files(table, [delete_file], Operation.DELETE)
    data = list(_dataframe_to_data_files(table.metadata, rows.cast(table.schema().as_arrow()), table.io))
    return commit_delete_files(table, [delete_file], Operation.OVERWRITE, data)


def _delete_file(
    table: Table, rows: pa.Table, content: Any, equality_ids: list[int] | None = None, file_format: str = "PARQUET"
) -> Any:
    """A delete file of ``rows`` in ``file_format`` (an AVRO one is written as its writer would name it, with bytes
    no reader here takes: what is tested is that it is refused)."""
    import pyarrow.orc as orc
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, FileFormat
    from pyiceberg.typedef import Record

    path = f"{table.location()}/data/{uuid.uuid4()}-deletes.{file_format.lower()}"
    with table.io.new_output(path).create() as out:
        if file_format == "PARQUET":
            pq.write_table(rows, out)
        elif file_format == "ORC":
            orc.write_table(rows, out)
        else:
            out.write(b"Obj\x01")  # an Avro object container's magic, and no more
    delete_file = DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat[file_format],
        partition=Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=len(table.io.new_input(path).open().read()),
        equality_ids=equality_ids,
    )
    delete_file.spec_id = table.spec().spec_id
    return delete_file


def commit_delete_files(
    table: Table,
    delete_files: list[Any],
    operation: Operation,
    data: list[Any] | None = None,
    *,
    manifest_version: int = 2,
) -> int:
    """One snapshot (through pyiceberg's own producer) adding ``data`` files and a delete manifest of the delete files
    (written in the manifest format ``manifest_version``: 3 for a v3 table's deletion vectors)."""
    from pyiceberg.manifest import (
        DataFileContent,
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
        ManifestWriterV2,
    )

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def version(self) -> Any:
            return manifest_version

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    kind = "equality" if delete_files[0].content == DataFileContent.EQUALITY_DELETES else "position"
    properties = {
        "added-delete-files": str(len(delete_files)),
        f"added-{kind}-deletes": str(sum(f.record_count for f in delete_files)),
    }
    with table.transaction() as txn, txn.update_snapshot(snapshot_properties=properties).fast_append() as producer:
        producer._operation = operation
        for data_file in data or []:
            producer.append_data_file(data_file)

        def with_the_delete_manifest(manifests: list) -> list:  # type: ignore[type-arg]
            writer = DeleteManifestWriter(
                table.spec(), table.schema(), producer.new_manifest_output(), producer._snapshot_id, "deflate"
            )
            with writer:
                for delete_file in delete_files:
                    entry = ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=producer._snapshot_id, data_file=delete_file
                    )
                    writer.add(entry)
            return [*manifests, writer.to_manifest_file()]

        producer._process_manifests = with_the_delete_manifest  # type: ignore[method-assign]
    return table.refresh().metadata.current_snapshot_id  # type: ignore[return-value]


def positions_of(table: Table, ids: list[str], id_column: str = "ticket_id") -> dict[str, list[int]]:
    """Where rows live: {data file: positions} of the rows with these ids in the current snapshot (files read
    whole, deleted rows included, as a delete file names them)."""
    import pyarrow.parquet as pq

    out: dict[str, list[int]] = {}
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as f:
            values = pq.read_table(f, columns=[id_column]).column(0).to_pylist()
        for pos, value in enumerate(values):
            if value in ids:
                out.setdefault(task.file.file_path, []).append(pos)
    return out


def update_copy_on_write(table: Table, change: Callable[[pa.Table], pa.Table]) -> int:
    """Commit one ``overwrite`` snapshot as Spark's copy-on-write ``UPDATE`` / ``MERGE`` leaves it: each data file
    whose rows ``change`` alters is replaced by a file of its rows after the change (the unchanged ones copied), in
    the same snapshot; nothing is appended. (pyiceberg's own ``overwrite`` and ``upsert`` commit a delete and an
    append.) Returns the snapshot id, or the current one when nothing changed."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    rewrites = []
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as f:
            rows = pq.read_table(f).cast(table.schema().as_arrow())
        changed = change(rows)
        if not changed.equals(rows):
            rewrites.append((task.file, changed))
    if not rewrites:
        return table.metadata.current_snapshot_id  # type: ignore[return-value]
    with table.transaction() as txn, txn.update_snapshot().overwrite() as overwrite:
        for old, rows in rewrites:
            overwrite.delete_data_file(old)
            for new in _dataframe_to_data_files(table.metadata, rows, table.io, overwrite.commit_uuid):
                overwrite.append_data_file(new)
    return table.refresh().metadata.current_snapshot_id  # type: ignore[return-value]


def compact(table: Table) -> int:
    """Commit one ``replace`` snapshot as a compaction (Spark's ``rewrite_data_files``) leaves it: every live data
    file rewritten into one, the rows and their order kept, nothing added or removed (pyiceberg writes no
    ``replace``: its overwrite is committed under that operation). The table must hold no delete file. The new file
    gets the snapshot's sequence number (``use-starting-sequence-number=false``). Returns the snapshot id."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class _Replace(_OverwriteFiles):
        def _summary(self, snapshot_properties: Any = None) -> Summary:
            summary = super()._summary(snapshot_properties or {})
            return Summary(Operation.REPLACE, **summary.additional_properties)

    tasks = list(table.scan().plan_files())
    assert all(not t.delete_files for t in tasks), "compact: the table holds delete files"
    old = [t.file for t in tasks]
    rows = []
    for f in old:
        with table.io.new_input(f.file_path).open() as stream:
            rows.append(pq.read_table(stream).cast(table.schema().as_arrow()))
    with table.transaction() as txn:
        producer = _Replace(operation=Operation.OVERWRITE, transaction=txn, io=table.io)
        with producer as rewrite:
            for f in old:
                rewrite.delete_data_file(f)
            for new in _dataframe_to_data_files(table.metadata, pa.concat_tables(rows), table.io, rewrite.commit_uuid):
                rewrite.append_data_file(new)
    return table.refresh().metadata.current_snapshot_id  # type: ignore[return-value]


def remove_orphan_files(table: Table) -> list[str]:
    """Table maintenance after an expiry (Spark's ``expire_snapshots`` deletes them, or ``remove_orphan_files``):
    delete every data and delete file under the table's ``data/`` folder that no remaining snapshot lists. Local
    (``file://``) warehouses only. Returns the paths deleted."""
    from pathlib import Path
    from urllib.parse import urlparse

    location = urlparse(table.metadata.location)
    assert location.scheme == "file", "remove_orphan_files: a local warehouse only"
    kept = {
        e.data_file.file_path
        for s in table.metadata.snapshots
        for m in s.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    }
    gone = []
    for path in sorted((Path(location.path) / "data").rglob("*.parquet")):
        uri = f"file://{path}"
        if uri not in kept:
            path.unlink()
            gone.append(uri)
    return gone
