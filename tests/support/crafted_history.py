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

from pyiceberg.manifest import write_manifest_list
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary


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
    from pyiceberg.serializers import ToOutputFile
    from pyiceberg.table.refs import SnapshotRef
    from pyiceberg.table.snapshots import SnapshotLogEntry

    meta = table.metadata
    last = snapshots[-1]
    update: dict = {
        "snapshots": [*meta.snapshots, *snapshots],
        "snapshot_log": [*meta.snapshot_log, *(SnapshotLogEntry(snapshot_id=s.snapshot_id,
                                                                 timestamp_ms=s.timestamp_ms) for s in snapshots)],
        "refs": {**meta.refs, MAIN_BRANCH: SnapshotRef(snapshot_id=last.snapshot_id,
                                                       snapshot_ref_type=SnapshotRefType.BRANCH)},
        "current_snapshot_id": last.snapshot_id,
        "last_updated_ms": last.timestamp_ms,
    }  # fmt: skip
    if meta.format_version >= 2:
        update["last_sequence_number"] = last.sequence_number
    crafted = meta.model_copy(update=update)
    path = f"{meta.location}/metadata/{uuid.uuid4()}-crafted.metadata.json"
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
