"""The results table's contract, in one place: its own columns, the statuses a row may have, and its schema
for a task (its verdict columns after the system ones).

Every source row of a run becomes exactly one result row with an explicit ``status``:

- ``ok``: the answer parsed and validated; the verdict columns are filled.
- ``invalid_output``: the model answered but the answer is not schema-valid JSON (``raw_output`` keeps it,
  ``error`` says why). Never turned into a made-up label.
- ``inference_error``: the engine or endpoint failed for this row (``error`` holds the message).
- ``empty_input``: every input column was blank: nothing to label (the model's answer, if any, is kept in
  ``raw_output``, not taken as labels).

Each row names its source row (``source_file``, ``source_pos``: which data file, which position) and its
content (``source_hash``). The job writes the rows (``icebatch_job.commit.results``), the ledger reads them
(``icebatch.core.ledger``), the CLI queries them (``icebatch results``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icebatch.core.task import TaskSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema

STATUS_OK = "ok"
STATUS_INVALID = "invalid_output"
STATUS_ERROR = "inference_error"
STATUS_EMPTY = "empty_input"  # every input blank: the model's answer is kept in raw_output, not taken as labels
STATUSES = (STATUS_OK, STATUS_INVALID, STATUS_ERROR, STATUS_EMPTY)


def _system_fields() -> list[Any]:
    """The results table's own columns, in order (field ids 1..16): the one declaration of them."""
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
        NestedField(1, "source_id", StringType(), required=True, doc="Id of the source row"),
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


def results_schema(task: TaskSpec) -> Schema:
    """System columns, then one optional column per output property of the task.

    A row is identified by its source row and the task version: a new version is a backfill beside the
    old version's rows.
    """
    from pyiceberg.schema import Schema
    from pyiceberg.types import BooleanType, DoubleType, LongType, NestedField, StringType

    fields = _system_fields()
    types = {"string": StringType(), "integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}
    for i, (name, prop) in enumerate(task.output_fields.items()):
        if name in SYSTEM_COLUMNS:
            raise ValueError(f"output property {name!r} clashes with a results system column")
        fields.append(NestedField(100 + i, name, types[prop["type"]], required=False, doc=prop.get("description")))
    return Schema(*fields, identifier_field_ids=[1, 13])


def results_arrow_schema(task: TaskSpec) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(results_schema(task), include_field_ids=False)
