"""Merge-on-read deletes, applied by position: a planned data file is read whole, so that positions keep naming
its rows, and the rows its delete files remove are skipped as done rows are (``PlannedRange.deleted``).

- **Position delete files** (Spark's ``write.delete.mode=merge-on-read``) name (data file, position) pairs.
- **Equality delete files** (Flink's and Kafka Connect's upserts, Spark or Trino merge-on-read with equality
  deletes) hold values of some columns (the file's ``equality_ids``). A row of a data file is deleted when its
  values equal one of the delete file's rows (a null equals a null), the delete file's data sequence number is
  greater than the data file's (an upsert's delete never removes the new row written beside it), and both are in
  the same partition (a delete file of an unpartitioned spec applies to every partition): the Iceberg spec's
  rules. pyiceberg 0.12 plans and reads no equality delete: here they are matched on the driver, reading only
  the equality columns of the data files they may apply to. Parquet and ORC delete files, as pyiceberg reads
  data and position deletes (Avro: a permanent error saying how to rewrite them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from icebatch.core.errors import WatermarkError

from icebatch_job.commit.done import DoneRows

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile, ManifestEntry
    from pyiceberg.table import FileScanTask, Table
    from pyiceberg.table.metadata import TableMetadata

LIVE = ("ADDED", "EXISTING")


def plan_files(
    meta: TableMetadata, io: Any, manifests: list[Any], taken: Callable[[Any], bool]
) -> tuple[list[FileScanTask], DoneRows]:
    """The data files of ``manifests`` that ``taken`` keeps, in path order, without their delete files, and the
    rows (file, position) that the delete files among them remove."""
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.table import ManifestGroupPlanner

    sequences: dict[str, int] = {}
    equality: list[ManifestEntry] = []

    def take(entry: Any) -> bool:
        if not taken(entry):
            return False
        content = entry.data_file.content
        if content != DataFileContent.DATA:
            readable(entry.data_file)
        if content == DataFileContent.EQUALITY_DELETES:  # pyiceberg's planner refuses them: matched here
            equality.append(entry)
            return False
        if content == DataFileContent.DATA:
            sequences[entry.data_file.file_path] = entry.sequence_number or 0
        return True

    planner = ManifestGroupPlanner(table_metadata=meta, io=io)
    planned = sorted(
        planner.plan_files(manifests=manifests, manifest_entry_filter=take), key=lambda t: t.file.file_path
    )
    tasks, deleted = _without_position_deletes(planned, io)
    if equality:
        deleted = deleted.union(_equality_deleted(tasks, equality, sequences, meta, io))
    return tasks, deleted


def _without_position_deletes(tasks: list[FileScanTask], io: Any) -> tuple[list[FileScanTask], DoneRows]:
    """Each task without its (position) delete files, and the positions those name."""
    from pyiceberg.io.pyarrow import _read_deletes
    from pyiceberg.table import FileScanTask

    deleted = DoneRows()
    out = []
    for t in tasks:
        if not t.delete_files:
            out.append(t)
            continue
        path = t.file.file_path
        for delete_file in t.delete_files:
            positions = _read_deletes(io, delete_file).get(path)
            if positions is not None and len(positions):
                deleted.add([path] * len(positions), positions.to_pylist())
        out.append(FileScanTask(t.file, residual=t.residual))
    return out, deleted


def _equality_deleted(
    tasks: list[FileScanTask], equality: list[ManifestEntry], sequences: dict[str, int], meta: TableMetadata, io: Any
) -> DoneRows:
    """The rows of ``tasks``' files that the equality delete files remove (only delete files newer than the oldest
    of those files are read: an older one cannot apply to any)."""
    floor = min((sequences.get(t.file.file_path, 0) for t in tasks), default=None)
    if floor is None:
        return DoneRows()
    deletes = [
        (e.sequence_number or 0, e.data_file, _delete_keys(e.data_file, meta, io))
        for e in equality
        if (e.sequence_number or 0) > floor
    ]
    deleted = DoneRows()
    for task in tasks:
        data = task.file
        keys: dict[tuple[int, ...], set[tuple[Any, ...]]] = {}
        for sequence, delete_file, (ids, values) in deletes:
            if sequence > sequences.get(data.file_path, 0) and _same_partition(delete_file, data, meta):
                keys.setdefault(ids, set()).update(values)
        for ids, values in keys.items():
            rows = _columns(data, ids, meta, io)
            positions = [p for p, row in enumerate(rows) if row in values]
            deleted.add([data.file_path] * len(positions), positions)
    return deleted


def _same_partition(delete_file: DataFile, data: DataFile, meta: TableMetadata) -> bool:
    if meta.specs()[delete_file.spec_id].is_unpartitioned():
        return True
    return delete_file.spec_id == data.spec_id and delete_file.partition == data.partition


def _delete_keys(delete_file: DataFile, meta: TableMetadata, io: Any) -> tuple[tuple[int, ...], set[tuple[Any, ...]]]:
    """An equality delete file's field ids and its rows' values (columns found by field id, else by name)."""
    ids = tuple(delete_file.equality_ids or ())
    if not ids:
        raise WatermarkError(f"equality delete file {delete_file.file_path} names no equality field ids: unreadable")
    table = _read_delete_file(delete_file, io)
    by_id = {
        int(field.metadata[b"PARQUET:field_id"]): field.name
        for field in table.schema
        if field.metadata and b"PARQUET:field_id" in field.metadata
    }
    names = [by_id.get(i) or _field(meta, i, delete_file.file_path).name for i in ids]
    columns = [table.column(n).to_pylist() for n in names]
    return ids, set(zip(*columns, strict=True))


def readable(delete_file: DataFile) -> None:
    """Refuse a delete file in a format nothing here reads: Parquet and ORC are read (as pyiceberg reads data files and
    position deletes), and deletion vectors (Puffin); an Avro one would fail the job after its work, or not at all."""
    from pyiceberg.manifest import DataFileContent, FileFormat

    formats = {FileFormat.PARQUET, FileFormat.ORC}
    if delete_file.content == DataFileContent.POSITION_DELETES:
        formats.add(FileFormat.PUFFIN)
    if delete_file.file_format in formats:
        return
    kind = "equality" if delete_file.content == DataFileContent.EQUALITY_DELETES else "position"
    raise WatermarkError(
        f"{kind} delete file {delete_file.file_path} is {delete_file.file_format.name}: icebatch, like pyiceberg, "
        "reads delete files in Parquet or ORC (and deletion vectors); set the source's write.delete.format.default "
        "to parquet and rewrite its delete files (Spark: rewrite_position_delete_files, or rewrite_data_files with "
        "delete-file-threshold=1)"
    )


def readable_deletes(table: Table, snapshot_id: int) -> None:
    """Refuse, before any work, a snapshot whose live delete files are not all ``readable`` (the removals read the
    rows live at it; its delete manifests alone are read)."""
    from pyiceberg.manifest import ManifestContent

    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                readable(entry.data_file)


def _read_delete_file(delete_file: DataFile, io: Any) -> pa.Table:
    """A Parquet or ORC delete file, whole (ORC carries no field ids pyarrow reads: its columns are found by name)."""
    from pyiceberg.manifest import FileFormat

    readable(delete_file)
    with io.new_input(delete_file.file_path).open() as f:
        if delete_file.file_format == FileFormat.ORC:
            import pyarrow.orc as orc

            return orc.ORCFile(f).read()
        import pyarrow.parquet as pq

        return pq.read_table(f)


def _columns(data: DataFile, ids: tuple[int, ...], meta: TableMetadata, io: Any) -> list[tuple[Any, ...]]:
    """A data file's values of the fields ``ids``, one tuple per row in file order (read by field id, so renamed
    columns and files written under older schemas read alike)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask

    projection = Schema(*(_field(meta, i, data.file_path) for i in ids))
    scan = ArrowScan(table_metadata=meta, io=io, row_filter=AlwaysTrue(), projected_schema=projection)
    table = scan.to_table([FileScanTask(data)])
    if table.num_rows != data.record_count:
        raise RuntimeError(f"{data.file_path} yielded {table.num_rows} rows, its manifest says {data.record_count}")
    return list(zip(*(c.to_pylist() for c in table.columns), strict=True))


def _field(meta: TableMetadata, field_id: int, where: str) -> Any:
    for schema in (meta.schema(), *reversed(meta.schemas)):
        try:
            return schema.find_field(field_id)
        except ValueError:
            continue
    raise WatermarkError(f"{where}: field id {field_id} of an equality delete is in no schema of the table")


def live_column(table: Table, snapshot_id: int, column: str) -> pa.ChunkedArray:
    """A column of the rows live at ``snapshot_id``, every delete file applied (pyiceberg's scan where it can:
    it reads no equality delete file)."""
    import numpy as np
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    readable_deletes(table, snapshot_id)
    try:
        return table.scan(snapshot_id=snapshot_id, selected_fields=(column,)).to_arrow().column(0)
    except ValueError as e:
        if "equality deletes" not in str(e):
            raise
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    tasks, deleted = plan_files(
        table.metadata, table.io, list(snapshot.manifests(table.io)), lambda e: e.status.name in LIVE
    )
    projection = table.schema().select(column)
    scan = ArrowScan(table_metadata=table.metadata, io=table.io, row_filter=AlwaysTrue(), projected_schema=projection)
    parts: list[pa.Array] = []
    for task in tasks:
        values = scan.to_table([task]).column(0).combine_chunks()
        skip = deleted.positions(task.file.file_path)
        if skip is not None:
            values = values.filter(pa.array(~np.isin(np.arange(len(values)), skip)))
        parts.append(values)
    kind = parts[0].type if parts else projection.as_arrow().field(0).type  # (files may read as string or large)
    return pa.chunked_array([p.cast(kind) for p in parts], kind)
