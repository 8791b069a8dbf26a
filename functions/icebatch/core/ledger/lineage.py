"""A snapshot's ancestry in linear time.

pyiceberg's ``ancestors_of`` finds each parent with ``TableMetadata.snapshot_by_id``, a linear scan of
the snapshot list: walking a table's history is quadratic in its snapshots (at 1,000 snapshots, most of
the launcher's backlog check). The ledger walks two histories on every decision: the source table's and
the results table's (one snapshot per chunk).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot


def ancestry(start: Snapshot | None, meta: TableMetadata) -> Iterator[Snapshot]:
    """``start`` and its ancestors, newest first (as ``pyiceberg.table.snapshots.ancestors_of``)."""
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    snapshot = start
    while snapshot is not None:
        yield snapshot
        if snapshot.parent_snapshot_id is None:
            return
        snapshot = by_id.get(snapshot.parent_snapshot_id)
