"""The pipeline's last step, in the driver: engine outputs -> result rows (one per input row, explicit status).

The driver receives every engine output anyway (it commits them); parsing there costs it little and saves
a stage: on a small machine each Ray Data actor is a process that takes CPU from the engine, and each stage
boundary moves every batch through the object store once more.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icebatch.core.ledger.results_table import results_arrow_schema
from icebatch.core.task import TaskSpec

from icebatch_job.columns import (
    EMPTY_INPUT,
    GENERATED_TEXT,
    INFERENCE_ERROR,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    PARSED_FIELDS,
    SOURCE_FILE,
    SOURCE_HASH,
    SOURCE_ID,
    SOURCE_POS,
    TIME_TAKEN_LLM,
    TRUNCATED,
)
from icebatch_job.commit.results import result_row

if TYPE_CHECKING:
    import pyarrow as pa


def output_rows(batch: pa.Table) -> list[dict[str, Any]]:
    """The fields the parse reads, one dict per row."""
    columns = {f: batch.column(f).to_pylist() for f in PARSED_FIELDS if f in batch.column_names}
    return [{f: v[i] for f, v in columns.items()} for i in range(batch.num_rows)]


class ResultParser:
    """Validates every answer with the task's model; nothing is dropped or invented."""

    def __init__(self, task: TaskSpec, run_id: str, model: str) -> None:
        self.task = task
        self.run_id = run_id
        self.model = model
        self.schema = results_arrow_schema(task)

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow as pa

        now = datetime.now(UTC)
        rows = [
            result_row(
                source_id=r[SOURCE_ID],
                source_file=r[SOURCE_FILE],
                source_pos=r[SOURCE_POS],
                source_hash=r.get(SOURCE_HASH),
                run_id=self.run_id,
                task=self.task,
                processed_at=now,
                model=self.model,
                raw_output=r.get(GENERATED_TEXT),
                inference_error=r.get(INFERENCE_ERROR) or None,
                input_truncated=bool(r.get(TRUNCATED)),
                empty_input=bool(r.get(EMPTY_INPUT)),
                num_input_tokens=r.get(NUM_INPUT_TOKENS) or 0,
                num_generated_tokens=r.get(NUM_GENERATED_TOKENS) or 0,
                llm_seconds=max(0.0, float(r.get(TIME_TAKEN_LLM) or 0.0)),
            )
            for r in output_rows(batch)
        ]
        return pa.Table.from_pylist(rows, schema=self.schema)
