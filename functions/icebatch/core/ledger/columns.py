"""The task's columns in the source table, followed by field id: a rename keeps working, a drop stops nothing late.

A task names its columns (``id_column``, ``input_columns``) as they were when it was written. Iceberg
identifies a column by its field id, and a rename keeps the id; a column dropped and added again under
the same name (the only way to change a type beyond Iceberg's promotions) gets a new id. So every ledger
commit records the field id each task column was read from (``Key.SOURCE_FIELD_IDS``), and each plan
resolves the task's columns from the source's *current* schema:

- a recorded field id still in the schema: read under its current name (renamed or not), handed to the
  prompt under the task's name;
- a recorded field id gone: the column was dropped (or dropped and added again): ``InvalidTaskError``;
- no record (the consumer's first run, a new task version, a column a new task added): by name, and a
  name the schema lacks is ``InvalidTaskError`` too.

All of it from the table's metadata (the launcher reads it, without pyarrow), before any job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icebatch.core.errors import InvalidTaskError, WatermarkError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from icebatch.core.consumers import Consumer


@dataclass(frozen=True)
class ColumnRead:
    task_name: str  # as the task (and its prompt) names it
    source_name: str  # the column's name in the source's schema now
    field_id: int


@dataclass(frozen=True)
class SourceColumns:
    """Where each of the task's columns is read in the source table now."""

    columns: tuple[ColumnRead, ...]

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(c.source_name for c in self.columns)

    @property
    def renamed(self) -> dict[str, str]:
        """Source name -> the task's name, for the columns whose name changed."""
        return {c.source_name: c.task_name for c in self.columns if c.source_name != c.task_name}

    def summary_value(self) -> str:
        """What a ledger commit records: the task's names and their field ids."""
        return json.dumps({c.task_name: c.field_id for c in self.columns}, separators=(",", ":"))


def parse_field_ids(value: str | None, *, where: str) -> dict[str, int] | None:
    """A commit's recorded field ids (None: commits that predate them)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in parsed.items()
    ):
        raise WatermarkError(
            f"{where} holds corrupt source field ids {value[:80]!r}. Fix: `icebatch ledger reset --to-snapshot <id>` "
            "records the task's columns as they are now"
        )
    return parsed


def task_columns(consumer: Consumer) -> tuple[str, ...]:
    task = consumer.task
    return tuple(dict.fromkeys((task.id_column, *task.input_columns)))


def resolve_columns(
    schema: Schema, consumer: Consumer, recorded: Mapping[str, int] | None, *, lenient: bool = False
) -> SourceColumns:
    """The task's columns in ``schema`` (see the module docstring); ``lenient`` leaves out the unresolvable
    (a reset records what it can) instead of raising ``InvalidTaskError``."""
    reads: list[ColumnRead] = []
    for name in task_columns(consumer):
        try:
            reads.append(_resolve(schema, consumer, name, (recorded or {}).get(name)))
        except InvalidTaskError:
            if not lenient:
                raise
    return SourceColumns(tuple(reads))


def _resolve(schema: Schema, consumer: Consumer, name: str, field_id: int | None) -> ColumnRead:
    what = f"consumer {consumer.name!r} (task {consumer.task.name!r} v{consumer.task_version})"
    role = "id column" if name == consumer.task.id_column else "input column"
    if field_id is not None:
        current = schema.find_column_name(field_id)
        if current is not None:
            return _readable(schema, consumer, ColumnRead(name, current, field_id), what, role)
        again = schema.find_field(name, case_sensitive=True) if _has(schema, name) else None
        also = (
            f"; a new column {name!r} (field id {again.field_id}, {again.field_type}) was added since: if it holds the "
            "same data, `icebatch ledger reset --to-snapshot <the watermark> --reason ...` records the columns as "
            "they are now"
            if again is not None
            else ""
        )
        raise InvalidTaskError(
            f"{what}: its {role} {name!r} (field id {field_id}, read by its last runs) was dropped from "
            f"{consumer.source_table!r}{also}. Nothing is launched for it: restore the column, or give the task a "
            "new version without it (consumers file)"
        )
    if not _has(schema, name):
        known = ", ".join(f.name for f in schema.fields)
        raise InvalidTaskError(
            f"{what}: {consumer.source_table!r} has no column {name!r} (its {role}); the table's columns: "
            f"{known[:400]}. Fix the task file (id_column, input_columns, user_template), or the consumer's"
            " source_table"
        )
    field = schema.find_field(name, case_sensitive=True)
    return _readable(schema, consumer, ColumnRead(name, name, field.field_id), what, role)


def _has(schema: Schema, name: str) -> bool:
    from pyiceberg.exceptions import ResolveError

    try:
        schema.find_field(name, case_sensitive=True)
    except (ValueError, ResolveError):
        return False
    return True


def _readable(schema: Schema, consumer: Consumer, read: ColumnRead, what: str, role: str) -> ColumnRead:
    """A column a prompt renders, or an id: a primitive value (not a struct, list or map)."""
    field = schema.find_field(read.field_id)
    if not field.field_type.is_primitive:
        raise InvalidTaskError(
            f"{what}: its {role} {read.task_name!r} is {field.field_type} in {consumer.source_table!r}; a task reads "
            "columns of plain values (text, numbers, dates, booleans). Fix the task file"
        )
    return read
