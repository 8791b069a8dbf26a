"""Content identity: a source row's verdict follows what the row says, not where it is stored.

Appends are new rows; but deletes, updates, overwrites and upserts rewrite data files (copy-on-write), so a
range (W, T] that holds a ``delete`` or ``overwrite`` snapshot has rows in rewritten files that are old
rows copied, rows changed, and rows new. Every result row carries ``source_hash``: a hash of its source
row's id and the columns the task reads (``content_hashes``). Over such a range the job

- reads the data files live at T that the range added (by any operation: ``source.plan_range``);
- sends to the model only the rows whose (id, hash) has no verdict of this task version yet (``unchanged``),
  once each: a rewritten copy of a labelled row is not labelled again, a changed row is;
- removes, in the commit that moves the watermark to T, the verdicts of ids no longer in the source at T
  (deleted: every task version's) and those a new verdict of this run supersedes (this task version's):
  ``removals``. The results table then holds one current verdict per live id and task version.

An append-only range is read as appended (no results are looked up), unless it may repeat ids a writer appended
again (``id_bounds``, ``work.repeats``): then it is matched the same way, nothing deleted. Verdicts written before
results carried a hash (``source_hash`` null) match their id whatever its content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from icebatch.core.ledger import superseded_filter
from icebatch.core.ledger.results_table import id_texts

from icebatch_job.columns import SOURCE_FILE, SOURCE_HASH, SOURCE_ID, SOURCE_POS
from icebatch_job.commit.done import DoneRows
from icebatch_job.plan.deletes import live_column

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table


def content_hashes(rows: pa.Table) -> pa.Array:
    """One signed 64-bit hash per row, of its values in column order (the id, then the task's columns)."""
    import pyarrow as pa

    columns = [c.to_pylist() for c in rows.columns]
    out = np.empty(rows.num_rows, dtype=np.int64)
    for i, values in enumerate(zip(*columns, strict=True)):
        text = json.dumps(values, default=str, ensure_ascii=False, separators=(",", ":"))
        out[i] = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)
    return pa.array(out, pa.int64())


@dataclass(frozen=True)
class Unchanged:
    """Rows of a range not to send to the model: their content already has a verdict (or a row before them in
    the range has the same content)."""

    rows: DoneRows
    count: int


def unchanged(
    candidates: Iterable[pa.Table],
    id_column: str,
    done: DoneRows,
    results: Table | None,
    task_version: int,
    *,
    run_id: str,
    committed: Iterable[tuple[str, int | None]] = (),
    keep_first: bool = False,
) -> Unchanged:
    """Of the range's rows (as read: with ``SOURCE_FILE``/``SOURCE_POS``/``SOURCE_HASH``), those not done whose
    (id, hash) has a verdict of ``task_version`` from a run other than ``run_id``, or repeats an earlier row's: one
    read before it, or one the run's earlier attempts committed (``committed``: their (id, hash); those rows are
    done, and not read again). ``keep_first`` (the consumer's ``on_update``): also those whose id has a verdict of
    ``task_version`` from another run, whatever its content.

    Every attempt of a run decides alike: the first sends the first row of each content and skips its repeats; a
    resumed one counts the content its predecessors committed as sent before the rows it reads. The run's own
    verdicts are that record, never an earlier run's (with ``keep_first`` they would also hide a changed row that the
    first attempt sent)."""
    import pyarrow as pa

    batches = [b for b in candidates if b.num_rows]
    rows = DoneRows()
    if not batches:
        return Unchanged(rows, 0)
    table = pa.concat_tables(batches)
    files = table.column(SOURCE_FILE).to_pylist()
    positions = np.asarray(table.column(SOURCE_POS).to_pylist(), dtype=np.int64)
    ids = [str(v) for v in table.column(id_column).to_pylist()]
    hashes = table.column(SOURCE_HASH).to_pylist()
    known, any_content = _verdicts(results, task_version, set(ids), run_id)
    if keep_first:
        any_content = any_content | {i for i, _ in known}
    already = done.contains(files, positions)
    seen: set[tuple[str, int | None]] = set(committed)
    skip_files, skip_positions = [], []
    for f, p, i, h, was_done in zip(files, positions.tolist(), ids, hashes, already, strict=True):
        if was_done:
            continue
        if (i, h) in known or i in any_content or (i, h) in seen:
            skip_files.append(f)
            skip_positions.append(p)
        seen.add((i, h))
    rows.add(skip_files, skip_positions)
    return Unchanged(rows, len(skip_files))


def _verdicts(
    results: Table | None, task_version: int, ids: set[str], run_id: str
) -> tuple[set[tuple[str, int]], set[str]]:
    """The (id, hash) pairs of ``ids`` with a verdict of ``task_version`` from a run other than ``run_id``; the ids
    whose verdict has no hash."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import And, EqualTo, NotEqualTo

    if results is None or results.current_snapshot() is None or not ids:
        return set(), set()
    hashed = results.schema().find_field("source_hash", case_sensitive=False) is not None
    columns = ("source_id", "source_hash") if hashed else ("source_id",)
    equal_to: Any = EqualTo
    not_equal_to: Any = NotEqualTo
    others = And(equal_to("task_version", task_version), not_equal_to("run_id", run_id))
    table = results.scan(row_filter=others, selected_fields=columns).to_arrow()
    texts = id_texts(table.column("source_id"))
    mask = pc.is_in(texts, value_set=pa.array(sorted(ids), pa.string()))
    found = texts.filter(mask).to_pylist()
    table = table.filter(mask)
    hashes = table.column("source_hash").to_pylist() if hashed else [None] * len(found)
    return {(i, h) for i, h in zip(found, hashes, strict=True) if h is not None}, {
        i for i, h in zip(found, hashes, strict=True) if h is None
    }


@dataclass(frozen=True)
class Removals:
    """What the commit that moves the watermark deletes from the results table."""

    gone: tuple[str, ...]  # ids no longer in the source: their verdicts, of every task version
    superseded: tuple[str, ...]  # ids this run labelled again: their other verdicts of this task version

    @property
    def count(self) -> int:
        return len(self.gone) + len(self.superseded)

    def expression(self, run_id: str, task_version: int) -> BooleanExpression | None:
        from pyiceberg.expressions import In, Or

        is_in: Any = In  # the pydantic mypy plugin misreads these expressions' own __init__
        parts: list[Any] = []
        if self.gone:
            parts.append(is_in("source_id", self.gone))
        if self.superseded:
            parts.append(superseded_filter(self.superseded, run_id, task_version))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else Or(parts[0], parts[1])


def removals(
    source: Table,
    to_snapshot: int,
    id_column: str,
    results: Table | None,
    run_id: str,
    task_version: int,
    labelled: Iterable[str],
    *,
    keep_deleted: bool = False,
) -> Removals:
    """The verdicts of ids not live in the source at ``to_snapshot`` (``id_column``: its name there; none when
    ``keep_deleted``, the consumer's ``on_delete: keep``), and those of this task version that this run's verdicts
    (``labelled``: ids of its rows not yet committed) supersede."""
    from pyiceberg.expressions import EqualTo

    if results is None or results.current_snapshot() is None:
        return Removals((), ())
    equal_to: Any = EqualTo  # the pydantic mypy plugin misreads these expressions' own __init__
    gone: list[str] = []
    if not keep_deleted:
        verdicts = results.scan(selected_fields=("source_id",)).to_arrow().column(0)
        gone = gone_ids(live_column(source, to_snapshot, id_column), verdicts)
    # (results files are written per chunk: a filter on the run prunes to its own files by their column bounds)
    mine = results.scan(row_filter=equal_to("run_id", run_id), selected_fields=("source_id",)).to_arrow()
    relabelled = sorted({*id_texts(mine.column(0)).to_pylist(), *labelled})
    if not relabelled:
        return Removals(tuple(gone), ())
    others = results.scan(
        row_filter=superseded_filter(relabelled, run_id, task_version), selected_fields=("source_id",)
    ).to_arrow()
    superseded = sorted(set(id_texts(others.column(0)).to_pylist()) - set(gone))
    return Removals(tuple(gone), tuple(superseded))


def gone_ids(live: pa.ChunkedArray, verdict_ids: pa.ChunkedArray) -> list[str]:
    """The distinct ``verdict_ids`` (result rows' ``source_id``: integers, or text) that are no value of ``live`` (the
    source's id column), as text, sorted. Without a Python object per row (a source has millions: ``make bench``):
    integer ids are compared as integers (a text that is not an integer's own, ``"007"``, is no live id's), strings
    by their text, in an anti join; other types by ``str`` of each value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    verdict_ids = pc.drop_null(verdict_ids)
    if len(verdict_ids) == 0:
        return []
    if pa.types.is_integer(live.type):
        try:
            numbers = pc.cast(verdict_ids, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a text that is no integer: compared as text
            numbers = None
        if numbers is not None and pa.types.is_integer(verdict_ids.type):  # a results table of typed ids
            gone = _not_in(numbers.to_numpy(), pc.drop_null(pc.cast(live, pa.int64())).to_numpy())
            return sorted(str(i) for i in np.unique(gone).tolist())
        if numbers is not None:
            own = pc.equal(pc.cast(numbers, pa.string()), pc.cast(verdict_ids, pa.string()))
            others = pc.unique(verdict_ids.filter(pc.invert(own))).to_pylist()  # not an integer's text: gone
            gone = _not_in(numbers.filter(own).to_numpy(), pc.drop_null(pc.cast(live, pa.int64())).to_numpy())
            return sorted({*(str(i) for i in np.unique(gone).tolist()), *others})
    texts = id_texts(live).cast(pa.large_string())
    left = pa.table({"id": id_texts(verdict_ids).cast(pa.large_string())})
    found = left.join(pa.table({"id": texts}), "id", join_type="left anti")
    return sorted(pc.unique(found.column("id")).to_pylist())


def _not_in(values: np.ndarray, live: np.ndarray) -> np.ndarray:
    """The ``values`` that are not in ``live`` (int64 both): a lookup table where the live ids span a range about as
    wide as they are many (ids that grow), else a hash join (random ids: sorting 10 million is slower)."""
    import pyarrow as pa

    if not len(live):
        return values
    if int(live.max()) - int(live.min()) <= 4 * (len(live) + len(values)):
        return values[~np.isin(values, live, kind="table")]
    joined = pa.table({"id": values}).join(pa.table({"id": live}), "id", join_type="left anti")
    return joined.column("id").to_numpy()


def labelled_ids(rows: pa.Table) -> list[str]:
    """The source ids of result rows (or of rows read, by their ``SOURCE_ID``)."""
    name = "source_id" if "source_id" in rows.column_names else SOURCE_ID
    return [str(v) for v in rows.column(name).to_pylist()]
