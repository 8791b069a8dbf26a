"""The last stage of the pipeline: engine outputs -> result rows (one per input row, explicit status)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icebatch.core.task import TaskSpec

from icebatch_job.columns import (
    EMPTY_INPUT,
    GENERATED_TEXT,
    INFERENCE_ERROR,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    SOURCE_FILE,
    SOURCE_ID,
    SOURCE_POS,
    TIME_TAKEN_LLM,
    TRUNCATED,
)
from icebatch_job.results import result_row, results_arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa


class ParseStage:
    """Ray Data UDF: validates every answer with the task's model; nothing is dropped or invented."""

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
            for r in batch.to_pylist()
        ]
        return pa.Table.from_pylist(rows, schema=self.schema)
