"""Building tables with many snapshots quickly (tests and benchmarks).

pyiceberg 0.12 deep-copies the whole table metadata (every snapshot) about twenty times per commit, so
building a 1,000-snapshot table one append at a time takes about 20 minutes on this machine. Inside
``fast_metadata_updates()`` the final defensive deep copy is skipped (the metadata models are frozen);
the table that results is an ordinary pyiceberg-written table (1,000 appends: about 75 s instead).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyiceberg.catalog
import pyiceberg.table
import pyiceberg.table.update as updates_module
from icebatch_job.example.tickets import append_tickets, arrow_schema, generate_tickets


def _update_without_deep_copy(
    base_metadata: Any,
    updates: tuple[Any, ...],
    enforce_validation: bool = False,
    metadata_location: str | None = None,
) -> Any:
    from pyiceberg.table.update import (
        _apply_table_update,
        _TableMetadataUpdateContext,
        _update_table_metadata_log,
    )
    from pyiceberg.utils.datetime import datetime_to_millis

    context = _TableMetadataUpdateContext()
    new = base_metadata
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base_metadata.last_updated_ms)
        if base_metadata.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    return new


@contextmanager
def fast_metadata_updates() -> Iterator[None]:
    modules = (updates_module, pyiceberg.table, pyiceberg.catalog)
    saved = [m.update_table_metadata for m in modules]
    for m in modules:
        m.update_table_metadata = _update_without_deep_copy  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m, original in zip(modules, saved, strict=True):
            m.update_table_metadata = original  # type: ignore[attr-defined]


def append_many(
    table: pyiceberg.table.Table,
    snapshots: int,
    rows_per_snapshot: Callable[[random.Random], int],
    *,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> list[int]:
    """Append ``snapshots`` snapshots of generated tickets; returns their ids."""
    rng = random.Random(seed)
    ids = []
    with fast_metadata_updates():
        for i in range(snapshots):
            ids.append(append_tickets(table, generate_tickets(rows_per_snapshot(rng), rng)))
            if progress and (i + 1) % 100 == 0:
                progress(i + 1)
    return ids


def arrow_rows(n: int, seed: int = 0) -> pa.Table:
    return pa.Table.from_pylist(generate_tickets(n, random.Random(seed)), schema=arrow_schema())
