"""Whether an append-only range may hold ids the consumer has seen: the source's id bounds, from its manifests.

An append is read as new rows, nothing looked up (``identity`` says why that matters for speed). But a writer
that retries a commit (Kafka Connect, a job re-run, an at-least-once sink) appends rows again that are already
labelled. Each watermark commit records the highest id of the source's rows up to it (``Key.SOURCE_ID_UPPER``);
a range whose files' ids (column statistics in the manifests it reads anyway) all lie above it, each file's apart
from the others', holds new ids only (a row twice in one data file is not told by its bounds). Otherwise, or
where the bounds are not known (no statistics, an id type without an order here), the job looks
(``identity.repeats``: the range's ids against the results'), and a range that repeats ids is matched by content
like a range that rewrote rows: a re-appended row with the same content gets no second verdict, one with new
content gets a verdict that supersedes the old.

Ids that grow (a sequence, a timestamped key) keep every range on the fast path; random ids (UUIDs) make every
run read its range's ids and the results' ids first. A ledger without the record (older commits, a reset, a run
closed part way) reads the id bounds of every file live at the range's end once, and records them from then on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask, Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.types import NestedField

ORDERED = {"int": "integer", "long": "integer", "string": "string"}  # id types compared here, by family


@dataclass(frozen=True)
class IdBounds:
    """The id field's bounds over some data files; None where a file has no statistics for it."""

    family: str
    lower: Any
    upper: Any

    def record(self) -> str:
        """``Key.SOURCE_ID_UPPER``'s value: the upper bound and its type family."""
        return json.dumps({"type": self.family, "upper": self.upper}, ensure_ascii=False)


@dataclass(frozen=True)
class Verdict:
    new_ids_only: bool  # every id of the range lies above the recorded upper bound
    record: str | None  # what the watermark commit records (None: not known)


def id_field(table: Table, name: str) -> NestedField | None:
    """The source's id field, where its type is one compared here."""
    field = table.schema().find_field(name)
    return field if str(field.field_type) in ORDERED else None


def bounds(field: NestedField, files: Iterable[Any]) -> IdBounds | None:
    """The id's bounds over ``files`` (pyiceberg ``DataFile``s); None when one lacks statistics for it (or none)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import PrimitiveType

    kind = field.field_type
    assert isinstance(kind, PrimitiveType)  # ``id_field``: int, long or string
    lowers, uppers = [], []
    for f in files:
        low, high = (f.lower_bounds or {}).get(field.field_id), (f.upper_bounds or {}).get(field.field_id)
        if low is None or high is None:
            return None
        lowers.append(from_bytes(kind, low))
        uppers.append(from_bytes(kind, high))
    if not lowers:
        return None
    return IdBounds(ORDERED[str(field.field_type)], min(lowers), max(uppers))


def recorded_upper(record: str | None, family: str) -> Any:
    """The recorded upper bound, where it is of this family; None otherwise (not recorded, or the id changed)."""
    if not record:
        return None
    try:
        value = json.loads(record)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("type") != family:
        return None
    upper = value.get("upper")
    return upper if isinstance(upper, int if family == "integer" else str) else None


def judge(
    table: Table,
    end: Snapshot,
    id_name: str,
    tasks: Iterable[FileScanTask],
    record: str | None,
    in_range: Callable[[Any], bool],
) -> Verdict:
    """Whether the range's files (``tasks``) hold new ids only, against the ``record`` of the ids up to the watermark
    (read from the files live at ``end`` that the range did not add, ``in_range`` telling which, where not
    recorded), and the record its watermark commit makes."""
    field = id_field(table, id_name)
    tasks = list(tasks)
    mine = bounds(field, (t.file for t in tasks)) if field is not None else None
    if field is None or (mine is None and tasks):
        return Verdict(False, None)
    family = ORDERED[str(field.field_type)]
    before = recorded_upper(record, family)
    if before is None:  # not recorded: the files live at the end that the range did not add say it, once
        earlier = _live_files(table, end, lambda entry: not in_range(entry))
        found = bounds(field, earlier) if earlier else IdBounds(family, None, None)
        if found is None:
            return Verdict(False, None)
        before = found.upper
    if mine is None:  # nothing of its own to read
        return Verdict(True, None if before is None else IdBounds(family, None, before).record())
    upper = mine.upper if before is None else max(before, mine.upper)
    new = (before is None or mine.lower > before) and _apart(field, [t.file for t in tasks])
    return Verdict(new, IdBounds(family, mine.lower, upper).record())


def _apart(field: NestedField, files: list[Any]) -> bool:
    """Whether the files' id ranges overlap nowhere (a retried append's file overlaps the one it repeats)."""
    spans = sorted((b.lower, b.upper) for f in files if (b := bounds(field, [f])) is not None)
    return all(later[0] > earlier[1] for earlier, later in pairwise(spans))


def _live_files(table: Table, end: Snapshot, keep: Callable[[Any], bool]) -> list[Any]:
    """The data files live at ``end`` that ``keep`` keeps."""
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

    live = (ManifestEntryStatus.ADDED, ManifestEntryStatus.EXISTING)
    files = []
    for manifest in end.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status in live and entry.data_file.content == DataFileContent.DATA and keep(entry):
                files.append(entry.data_file)
    return files
