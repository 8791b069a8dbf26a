"""The results table's rows as the job writes them: one per source row, statistics of a run, and streaming
data-file writes. The table's contract (columns, statuses, schema) is ``icebatch.core.ledger.results_table``.

Each row names its source row (``source_file``, ``source_pos``: which data file, which position), so the
ledger knows exactly which source rows are done. A chunk's rows are written into data files that only
become visible with its ledger commit (``icebatch.core.ledger.ResultsLedger.commit_chunk``).
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icebatch.core.ledger import RunTotals
from icebatch.core.ledger.results_table import STATUS_EMPTY, STATUS_ERROR, STATUS_INVALID, STATUS_OK
from icebatch.core.task import TaskSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

# what RunStats reads of a result row (with the task's label columns)
STATS_COLUMNS = ("status", "error", "num_input_tokens", "num_generated_tokens", "input_truncated", "llm_seconds")


@dataclass
class RunStats:
    """Counts and token totals of a run, accumulated while result batches stream past."""

    label_fields: list[str]
    rows: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    truncated: int = 0
    llm_seconds: float = 0.0
    labels: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    first_error: str | None = None  # the first inference_error message (for the failure report)

    def observe(self, batch: pa.RecordBatch | pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        self.statuses.update(batch.column("status").to_pylist())
        self.input_tokens += int(pc.sum(batch.column("num_input_tokens")).as_py() or 0)
        self.output_tokens += int(pc.sum(batch.column("num_generated_tokens")).as_py() or 0)
        self.truncated += int(pc.sum(pc.cast(batch.column("input_truncated"), "int64")).as_py() or 0)
        self.llm_seconds += float(pc.sum(batch.column("llm_seconds")).as_py() or 0.0)
        for name in self.label_fields:
            self.labels[name].update(v for v in batch.column(name).to_pylist() if v is not None)
        if self.first_error is None and STATUS_ERROR in self.statuses:
            for status, error in zip(
                batch.column("status").to_pylist(), batch.column("error").to_pylist(), strict=True
            ):
                if status == STATUS_ERROR:
                    self.first_error = error
                    break

    def stream(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.observe(batch)
            yield batch

    @property
    def ok(self) -> int:
        return self.statuses[STATUS_OK]

    @property
    def errors(self) -> int:
        return self.rows - self.ok

    def totals(self, **run: Any) -> RunTotals:
        """The run's totals: these counts, and what the job measured of the run (``RunTotals`` fields)."""
        return RunTotals(
            rows=self.rows,
            rows_ok=self.ok,
            rows_error=self.errors,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            rows_truncated=self.truncated,
            **run,
        )

    def label_breakdown(self) -> dict[str, dict[str, int]]:
        return {k: dict(v.most_common()) for k, v in self.labels.items()}


def batch_engine_seconds(batch: pa.Table) -> float:
    """The engine time of a batch of result rows: they were generated together, so the longest row's."""
    return max((v for v in batch.column("llm_seconds").to_pylist() if v is not None), default=0.0)


def write_data_files(table: Table, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> list[DataFile]:
    """Stream batches into Parquet data files of the results table (not yet committed)."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import _dataframe_to_data_files  # pinned pyiceberg==0.12.0

    def conformed() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield pa.Table.from_batches([batch]).select(schema.names).cast(schema).to_batches()[0]

    reader = pa.RecordBatchReader.from_batches(schema, conformed())
    return list(_dataframe_to_data_files(table.metadata, reader, table.io, write_uuid=uuid.uuid4()))


def result_row(
    *,
    source_id: Any,
    source_file: str | None,
    source_pos: int | None,
    run_id: str,
    source_hash: int | None = None,
    task: TaskSpec,
    processed_at: Any,
    model: str | None,
    raw_output: str | None,
    inference_error: str | None = None,
    input_truncated: bool = False,
    empty_input: bool = False,
    num_input_tokens: int | None = None,
    num_generated_tokens: int | None = None,
    llm_seconds: float | None = None,
) -> dict[str, Any]:
    """One result row: parse and validate the answer, never drop or invent a label."""
    verdict: dict[str, Any] | None = None
    error: str | None
    if inference_error:
        status, error = STATUS_ERROR, inference_error
    elif empty_input:
        status, error = STATUS_EMPTY, "every input column is empty: nothing to label (no verdict taken)"
    else:
        verdict, error = task.parse(raw_output or "")
        status = STATUS_OK if verdict is not None else STATUS_INVALID
    row: dict[str, Any] = {
        "source_id": str(source_id),
        "source_file": source_file,
        "source_pos": source_pos,
        "source_hash": source_hash,
        "run_id": run_id,
        "task": task.name,
        "task_version": task.version,
        "status": status,
        "error": error,
        "raw_output": raw_output,
        "input_truncated": bool(input_truncated),
        "num_input_tokens": num_input_tokens,
        "num_generated_tokens": num_generated_tokens,
        "llm_seconds": llm_seconds,
        "model": model,
        "processed_at": processed_at,
    }
    for name in task.output_fields:
        row[name] = verdict.get(name) if verdict else None
    return row
