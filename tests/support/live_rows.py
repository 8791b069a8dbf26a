"""The rows live in a table's current snapshot, every delete file applied, written from the Iceberg spec with the
manifests and plain pyarrow (not pyiceberg's planner, which reads no equality delete file, nor the project's):
the tests' independent count over sources with merge-on-read deletes.

A position delete removes (file, position) from data files whose data sequence number is not greater than its
own; an equality delete removes the rows whose key columns equal one of its rows from data files whose data
sequence number is lower than its own. Columns are matched by name (the tests' tables are not renamed here).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table


def live_rows(table: Table) -> pa.Table:
    schema = table.schema().as_arrow()
    plain = pa.schema([f.with_type(pa.string()) if pa.types.is_large_string(f.type) else f for f in schema])
    snapshot = table.current_snapshot()
    if snapshot is None:
        return pa.Table.from_pylist([], schema=plain)
    io = table.io
    entries = [e for m in snapshot.manifests(io) for e in m.fetch_manifest_entry(io, discard_deleted=True)]

    def read(path: str) -> pa.Table:
        with io.new_input(path).open() as f:
            return orc.ORCFile(f).read() if path.endswith(".orc") else pq.read_table(f)

    positions: list[tuple[int, set[tuple[str, int]]]] = []
    equalities: list[tuple[int, list[str], set[tuple[Any, ...]]]] = []
    for e in entries:
        if e.data_file.content == DataFileContent.POSITION_DELETES:
            rows = read(e.data_file.file_path).to_pylist()
            positions.append((e.sequence_number or 0, {(r["file_path"], r["pos"]) for r in rows}))
        elif e.data_file.content == DataFileContent.EQUALITY_DELETES:
            rows = read(e.data_file.file_path)
            names = rows.column_names
            equalities.append((e.sequence_number or 0, names, {tuple(r[n] for n in names) for r in rows.to_pylist()}))
    kept: list[dict[str, Any]] = []
    for e in entries:
        if e.data_file.content != DataFileContent.DATA:
            continue
        path, sequence = e.data_file.file_path, e.sequence_number or 0
        for pos, row in enumerate(read(path).to_pylist()):
            if any((path, pos) in named for s, named in positions if s >= sequence):
                continue
            if any(tuple(row[n] for n in names) in keys for s, names, keys in equalities if s > sequence):
                continue
            kept.append(row)
    return pa.Table.from_pylist(kept, schema=schema).cast(plain)  # (strings as pyiceberg's scan reads them)


def has_equality_deletes(table: Table) -> bool:
    """Whether a live equality delete file is in the current snapshot (pyiceberg then cannot scan, delete or upsert)."""
    from pyiceberg.manifest import ManifestContent

    snapshot = table.current_snapshot()
    return snapshot is not None and any(
        e.data_file.content == DataFileContent.EQUALITY_DELETES
        for m in snapshot.manifests(table.io)
        if m.content == ManifestContent.DELETES
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    )
