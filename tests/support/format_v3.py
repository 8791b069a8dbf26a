"""A format v3 source as Spark (Iceberg 1.8+) leaves one: upgraded in place, row lineage assigned by each commit,
merge-on-read deletes as deletion vectors (Puffin files). pyiceberg 0.12 reads v3 metadata and deletion vectors
but writes neither, so what a v3 writer commits is written here: rows are committed through pyiceberg on the same
metadata as v2 (``written_as_v2``), then the metadata is v3 again, each new snapshot given the ``first-row-id`` and
``added-rows`` a v3 writer assigns. Catalogs that can register a table's metadata (SQL) only.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

ROW_POSITION_FIELD_ID = 2147483545  # the deletion vector blob's field: the row position (``_pos``)
DV_MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])
PUFFIN_MAGIC = b"PFA1"


def upgrade_to_v3(table: Table) -> Table:
    """``ALTER TABLE ... SET TBLPROPERTIES ('format-version'='3')``: the same table (uuid, snapshots), v3 from now on;
    rows written before have no row id (``next-row-id`` starts at 0)."""
    meta = _metadata_json(table)
    assert meta["format-version"] == 2, meta["format-version"]
    return _register(table, {**meta, "format-version": 3, "next-row-id": 0})


@contextmanager
def written_as_v2(table: Table) -> Iterator[Table]:
    """A v3 table that pyiceberg can commit to for the block (its metadata as v2); after it, v3 again, each snapshot
    the block committed assigned row ids as a v3 writer assigns them (``first-row-id``: the table's ``next-row-id``;
    ``added-rows``: the rows its data files add)."""
    v3 = _metadata_json(table)
    assert v3["format-version"] == 3, v3["format-version"]
    lineage = {s["snapshot-id"]: {k: s[k] for k in ("first-row-id", "added-rows") if k in s} for s in v3["snapshots"]}
    v2 = {k: v for k, v in v3.items() if k != "next-row-id"}
    v2["format-version"] = 2
    v2["snapshots"] = [{k: v for k, v in s.items() if k not in ("first-row-id", "added-rows")} for s in v3["snapshots"]]
    yield _register(table, v2)
    after = _metadata_json(table.catalog.load_table(table.name()))
    next_row_id = v3["next-row-id"]
    snapshots = []
    for s in after["snapshots"]:
        if s["snapshot-id"] in lineage:
            snapshots.append({**s, **lineage[s["snapshot-id"]]})
            continue
        added = int(s.get("summary", {}).get("added-records", 0))
        snapshots.append({**s, "first-row-id": next_row_id, "added-rows": added})
        next_row_id += added
    _register(table, {**after, "format-version": 3, "next-row-id": next_row_id, "snapshots": snapshots})


def add_deletion_vectors(table: Table, deletes: dict[str, list[int]]) -> int:
    """Commit a merge-on-read ``delete`` as a v3 writer leaves one: one Puffin file holding a ``deletion-vector-v1``
    blob per data file (its positions as a 64-bit Roaring bitmap), and a v3 delete manifest with one entry per blob
    (``referenced_data_file``, ``content_offset``, ``content_size_in_bytes``). Call inside ``written_as_v2``.
    Returns the snapshot id."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from tests.support.crafted_history import commit_delete_files

    path = f"{table.location()}/data/{uuid.uuid4()}-deletes.puffin"
    content, blobs = bytearray(PUFFIN_MAGIC), []
    for data_file, positions in sorted(deletes.items()):
        blob = _deletion_vector(positions)
        properties = {"referenced-data-file": data_file, "cardinality": str(len(set(positions)))}
        blobs.append(
            {
                "type": "deletion-vector-v1",
                "fields": [ROW_POSITION_FIELD_ID],
                "snapshot-id": -1,
                "sequence-number": -1,
                "offset": len(content),
                "length": len(blob),
                "properties": properties,
            }
        )
        content += blob
    footer = json.dumps({"blobs": blobs}).encode()
    content += PUFFIN_MAGIC + footer + len(footer).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC
    with table.io.new_output(path).create() as out:
        out.write(bytes(content))
    files = []
    for blob in blobs:
        dv = DataFile.from_args(
            _table_format_version=3,
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PUFFIN,
            partition=Record(),
            record_count=int(blob["properties"]["cardinality"]),
            file_size_in_bytes=len(content),
            referenced_data_file=blob["properties"]["referenced-data-file"],
            content_offset=blob["offset"],
            content_size_in_bytes=blob["length"],
        )
        dv.spec_id = table.spec().spec_id
        files.append(dv)
    return commit_delete_files(table, files, Operation.DELETE, manifest_version=3)


def _deletion_vector(positions: list[int]) -> bytes:
    """The ``deletion-vector-v1`` blob: length (4 bytes, big-endian), magic, the portable 64-bit Roaring bitmap
    (bucket count, then each bucket's key and 32-bit bitmap), CRC-32 of magic and bitmap (big-endian)."""
    from pyroaring import BitMap

    buckets: dict[int, list[int]] = {}
    for p in sorted(set(positions)):
        buckets.setdefault(p >> 32, []).append(p & 0xFFFFFFFF)
    bitmap = len(buckets).to_bytes(8, "little") + b"".join(
        key.to_bytes(4, "little") + BitMap(low).serialize() for key, low in sorted(buckets.items())
    )
    body = DV_MAGIC + bitmap
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def _metadata_json(table: Table) -> dict[str, Any]:
    with table.io.new_input(table.metadata_location).open() as f:
        return json.loads(f.read())  # type: ignore[no-any-return]


def _register(table: Table, meta: dict[str, Any]) -> Table:
    path = f"{meta['location']}/metadata/{uuid.uuid4()}-crafted.metadata.json"
    with table.io.new_output(path).create() as out:
        out.write(json.dumps(meta).encode())
    table.catalog.drop_table(table.name())  # the entry only: the files stay (the SQL catalog cannot overwrite one)
    return table.catalog.register_table(table.name(), path)
