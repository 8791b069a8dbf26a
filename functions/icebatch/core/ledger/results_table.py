"""The results table's contract, in one place: its own columns, the statuses a row may have, and its schema
for a task (its verdict columns after the system ones).

Every source row of a run becomes exactly one result row with an explicit ``status``:

- ``ok``: the answer parsed and validated; the verdict columns are filled.
- ``invalid_output``: the model answered but the answer is not schema-valid JSON (``raw_output`` keeps it,
  ``error`` says why). Never turned into a made-up label.
- ``inference_error``: the engine or endpoint failed for this row (``error`` holds the message).
- ``empty_input``: every input column was blank: nothing to label (the model's answer, if any, is kept in
  ``raw_output``, not taken as labels).

Each row names its source row: its id (``source_id``, in the source's own type where that is a string or an
integer and never null, so that results sort, filter and join as the source does; the source's name for it is the table
property ``icebatch.source-id-column``; tables made before hold it as text, and still work), where it is stored
(``source_file``, ``source_pos``: which data file, which position) and its content (``source_hash``). Inside the
job ids travel as text (``id_texts``), turned into the table's type as rows are written. The job writes the
rows (``icebatch_job.commit.results``), the ledger reads them (``icebatch.core.ledger``), the CLI queries them
(``icebatch results``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icebatch.core.task import TaskSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

STATUS_OK = "ok"
STATUS_INVALID = "invalid_output"
STATUS_ERROR = "inference_error"
STATUS_EMPTY = "empty_input"  # every input blank: the model's answer is kept in raw_output, not taken as labels
STATUSES = (STATUS_OK, STATUS_INVALID, STATUS_ERROR, STATUS_EMPTY)


SOURCE_ID_COLUMN = "icebatch.source-id-column"  # table property: the source's name for ``source_id``


def _system_fields(id_type: IcebergType | None = None) -> list[Any]:
    """The results table's own columns, in order (field ids 1..16): the one declaration of them. ``id_type``: the
    source id's (``id_type_for``; default text)."""
    from pyiceberg.types import (
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        NestedField,
        StringType,
        TimestamptzType,
    )

    return [
        NestedField(1, "source_id", id_type or StringType(), required=True, doc="Id of the source row"),
        NestedField(2, "run_id", StringType(), required=True, doc="Run that produced this row"),
        NestedField(
            3, "status", StringType(), required=True, doc="ok | invalid_output | inference_error | empty_input"
        ),
        NestedField(4, "error", StringType(), required=False, doc="Why the row is not ok"),
        NestedField(5, "raw_output", StringType(), required=False, doc="The model's text, as generated"),
        NestedField(6, "input_truncated", BooleanType(), required=True, doc="Input shortened to fit the context"),
        NestedField(7, "num_input_tokens", IntegerType(), required=False),
        NestedField(8, "num_generated_tokens", IntegerType(), required=False),
        NestedField(9, "llm_seconds", DoubleType(), required=False, doc="Time in the engine for this row"),
        NestedField(10, "model", StringType(), required=False),
        NestedField(11, "processed_at", TimestamptzType(), required=True),
        NestedField(12, "task", StringType(), required=True, doc="Task that labelled the row"),
        NestedField(13, "task_version", IntegerType(), required=True, doc="Version of the task (a backfill each)"),
        NestedField(14, "source_file", StringType(), required=False, doc="Source data file holding the row"),
        NestedField(15, "source_pos", LongType(), required=False, doc="Position of the row in that file"),
        NestedField(
            16,
            "source_hash",
            LongType(),
            required=False,
            doc="Hash of the source row's id and the columns the task reads (unchanged: not sent again)",
        ),
    ]


SYSTEM_COLUMNS = tuple(f.name for f in _system_fields())


def id_type_for(source_type: IcebergType) -> IcebergType:
    """What ``source_id`` holds for a source id of ``source_type``: the same type for a string or an integer (``int``,
    ``long``), text for any other (a UUID, a decimal, a date: its ``str``, as before)."""
    from pyiceberg.types import IntegerType, LongType, StringType

    return source_type if isinstance(source_type, StringType | IntegerType | LongType) else StringType()


def results_schema(task: TaskSpec, id_type: IcebergType | None = None) -> Schema:
    """System columns, then one optional column per output property of the task.

    A row is identified by its source row and the task version: a new version is a backfill beside the
    old version's rows. ``id_type``: ``source_id``'s (``id_type_for`` the source's id; default text).
    """
    from pyiceberg.schema import Schema
    from pyiceberg.types import BooleanType, DoubleType, LongType, NestedField, StringType

    fields = _system_fields(id_type)
    types = {"string": StringType(), "integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}
    for i, (name, prop) in enumerate(task.output_fields.items()):
        if name in SYSTEM_COLUMNS:
            raise ValueError(f"output property {name!r} clashes with a results system column")
        fields.append(NestedField(100 + i, name, types[prop["type"]], required=False, doc=prop.get("description")))
    return Schema(*fields, identifier_field_ids=[1, 13])


def results_arrow_schema(task: TaskSpec, id_type: IcebergType | None = None) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(results_schema(task, id_type), include_field_ids=False)


def with_id_type(schema: Schema, id_type: IcebergType) -> Schema:
    """``schema`` (a results table's) with ``source_id`` of ``id_type``."""
    from pyiceberg.schema import Schema

    fields = [f.model_copy(update={"field_type": id_type}) if f.name == "source_id" else f for f in schema.fields]
    return Schema(*fields, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids)


def source_id_type(results: Schema) -> IcebergType:
    """The type a results table holds ``source_id`` in (text in tables made before ids kept their type)."""
    return results.find_field("source_id").field_type


def id_texts(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Source ids as text, one per value (``str`` of it): how the job compares them whatever type a results table
    or the source holds them in. Arrow's cast for strings and integers (the same text, without a Python object per
    row), ``str`` otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or pa.types.is_integer(values.type):
        return pc.cast(values, pa.string())
    return pa.array([None if v is None else str(v) for v in values.to_pylist()], pa.string())
