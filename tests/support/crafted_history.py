"""A long table history in seconds: snapshots written into the metadata directly, as a streaming writer leaves them.

A table fed by Flink or Kafka Connect commits every checkpoint, whether or not rows arrived: thousands of
snapshots a day, most adding little or nothing. Appending them one by one through pyiceberg takes minutes
per thousand (its metadata is rewritten and copied on every commit). Here ``n`` snapshots are added in one
metadata commit: each is an ``append`` of no rows whose manifest list keeps the table's live manifests (one
list file, shared), so the table's rows, its readers and its metadata are what such a history leaves; only
the snapshots carry no rows of their own.
"""

from __future__ import annotations

import random
import uuid

from pyiceberg.manifest import write_manifest_list
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

from tests.support.many_snapshots import fast_metadata_updates


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
    updates = []
    for i, sid in enumerate(ids):
        snapshot = Snapshot(
            snapshot_id=sid,
            parent_snapshot_id=previous,
            sequence_number=first_seq + i if meta.format_version >= 2 else None,
            timestamp_ms=start_ms + i * every_ms,
            manifest_list=shared or _manifest_list(table, manifests, sid, previous, first_seq + i),
            summary=Summary(Operation.APPEND, **{"added-records": "0", "added-data-files": "0"}),
            schema_id=meta.current_schema_id,
        )
        updates.append(AddSnapshotUpdate(snapshot=snapshot))
        previous = sid
    updates.append(SetSnapshotRefUpdate(ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=ids[-1]))
    requirement = AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=parent.snapshot_id if parent else None)
    with fast_metadata_updates():
        txn = table.transaction()
        txn._apply(tuple(updates), (requirement,))
        txn.commit_transaction()
    return ids


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
