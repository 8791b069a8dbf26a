"""Which source rows of a run's range are done: their data file and row position, read from the ledger.

A source row is named by the data file that holds it and its position in that file: the data files of
append snapshots are immutable, so the name stays true for as long as the range is pinned. Every result
row carries it (``source_file``, ``source_pos``); the rows a run has committed therefore say exactly which
source rows a new attempt must skip, whatever was killed when.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

SOURCE_FILE_COLUMN = "source_file"
SOURCE_POS_COLUMN = "source_pos"


class DoneRows:
    """Positions done, per source data file (sorted, unique int64 arrays)."""

    def __init__(self) -> None:
        self._files: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return sum(len(a) for a in self._files.values())

    def add(self, files: Iterable[str], positions: Iterable[int]) -> None:
        by_file: dict[str, list[int]] = {}
        for f, p in zip(files, positions, strict=True):
            by_file.setdefault(f, []).append(p)
        for f, ps in by_file.items():
            new = np.asarray(ps, dtype=np.int64)
            old = self._files.get(f)
            self._files[f] = np.union1d(old, new) if old is not None else np.unique(new)

    def add_table(
        self, rows: pa.Table, file_column: str = SOURCE_FILE_COLUMN, pos_column: str = SOURCE_POS_COLUMN
    ) -> None:
        self.add(rows.column(file_column).to_pylist(), rows.column(pos_column).to_pylist())

    def positions(self, path: str) -> np.ndarray | None:
        return self._files.get(path)

    def union(self, other: DoneRows) -> DoneRows:
        out = DoneRows()
        out._files = dict(self._files)
        for f, positions in other._files.items():
            old = out._files.get(f)
            out._files[f] = np.union1d(old, positions) if old is not None else positions
        return out

    def only(self, paths: Iterable[str]) -> DoneRows:
        """The share of these files (what one read task needs to know)."""
        out = DoneRows()
        out._files = {p: self._files[p] for p in paths if p in self._files}
        return out

    def contains(self, files: list[str], positions: np.ndarray) -> np.ndarray:
        """For each (file, position): is it done?"""
        done = np.zeros(len(files), dtype=bool)
        if not self._files:
            return done
        files_arr = np.asarray(files, dtype=object)
        for f in set(files):
            known = self._files.get(f)
            if known is None:
                continue
            where = files_arr == f
            done[where] = np.isin(positions[where], known, assume_unique=False)
        return done


def committed_rows(
    results: Table, run_id: str, task_version: int, columns: tuple[str, ...], snapshot_id: int | None = None
) -> pa.Table:
    """The result rows a run has committed (whichever attempts committed them): as of ``snapshot_id`` when
    given and still in the table's history, else now."""
    from pyiceberg.expressions import And, EqualTo

    equal_to: Any = EqualTo  # the pydantic mypy plugin misreads EqualTo's own __init__
    if snapshot_id is not None and results.snapshot_by_id(snapshot_id) is None:
        snapshot_id = None
    return results.scan(
        row_filter=And(equal_to("run_id", run_id), equal_to("task_version", task_version)),
        selected_fields=columns,
        snapshot_id=snapshot_id,
    ).to_arrow()
