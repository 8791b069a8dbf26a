"""Reading exactly the rows of a pinned range: (from_snapshot_exclusive, to_snapshot_inclusive].

Two forms over the same plan (pyiceberg's ``incremental_append_scan``), both streaming:

- ``iter_batches``: Arrow record batches in this process.
- ``read_dataset``: a Ray dataset whose read tasks each scan a share of the planned files. Planning
  happens once, here on the driver (it reads manifest lists, never data files); Ray's own
  ``read_iceberg`` has no incremental option.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import ray.data
from icebatch.core.ledger import RunPlan
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import FileScanTask, Table

_INFLATION = 5  # Parquet on disk -> Arrow in memory, a rough planning factor


def _scan(table: Table, plan: RunPlan, columns: tuple[str, ...] | None) -> Any:
    return table.incremental_append_scan(
        from_snapshot_id_exclusive=plan.scan_from_exclusive,
        to_snapshot_id_inclusive=plan.to_snapshot_inclusive,
        selected_fields=columns or ("*",),
    )


def iter_batches(table: Table, plan: RunPlan, columns: tuple[str, ...] | None = None) -> Iterator[pa.RecordBatch]:
    """The range's rows as Arrow batches, one file at a time."""
    reader = _scan(table, plan, columns).to_arrow_batch_reader()
    yield from reader


READ_CONCURRENCY = 2


def read_dataset(
    table: Table,
    plan: RunPlan,
    columns: tuple[str, ...] | None = None,
    *,
    parallelism: int = -1,
    num_cpus: float = 0.25,
    concurrency: int = READ_CONCURRENCY,
) -> tuple[ray.data.Dataset, int | None]:
    """The range's rows as a streaming Ray dataset, and their exact count when known (no deletes apply).

    Read tasks ask for a fraction of a CPU: they are I/O-bound, and a whole CPU each can leave nothing for
    the engine's bundle on a small node. Few run at once (``concurrency``): one Parquet reader outpaces a
    GPU's generation by orders of magnitude, and each extra reader is another Ray worker process starting
    (importing pyarrow and pyiceberg) while the engine starts.
    """
    source = IncrementalIcebergDatasource(table, plan, columns)
    # never more than there are read tasks: Ray warns about a limit the read cannot reach
    tasks = source.file_count if parallelism < 1 else min(parallelism, source.file_count)
    readers = max(1, min(concurrency, tasks))
    dataset = ray.data.read_datasource(source, override_num_blocks=parallelism, num_cpus=num_cpus, concurrency=readers)
    return dataset, source.exact_rows


def _read_files(tasks: list[FileScanTask], metadata: Any, io: Any, schema: Any) -> Iterable[pa.Table]:
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow

    target = schema_to_pyarrow(schema, include_field_ids=False)
    scan = ArrowScan(table_metadata=metadata, io=io, row_filter=AlwaysTrue(), projected_schema=schema)
    for task in tasks:
        for batch in scan.to_record_batches(tasks=(task,)):
            yield pa.Table.from_batches([batch]).cast(target)


class IncrementalIcebergDatasource(Datasource):
    """Ray datasource over the files an incremental append scan planned (position deletes honoured)."""

    def __init__(self, table: Table, plan: RunPlan, columns: tuple[str, ...] | None = None) -> None:
        super().__init__()
        scan = _scan(table, plan, columns)
        self._tasks: list[FileScanTask] = list(scan.plan_files())
        self._schema = scan.projection()
        self._metadata = table.metadata
        self._io = table.io

    @property
    def file_count(self) -> int:
        return len(self._tasks)

    @property
    def exact_rows(self) -> int | None:
        return _exact_rows(self._tasks)

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(t.file.file_size_in_bytes for t in self._tasks) * _INFLATION

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        if not self._tasks:
            return []
        n = max(1, min(parallelism, len(self._tasks)))
        chunks: list[list[FileScanTask]] = [[] for _ in range(n)]
        for i, task in enumerate(sorted(self._tasks, key=lambda t: t.file.file_path)):
            chunks[i % n].append(task)
        arrow_schema = schema_to_pyarrow(self._schema, include_field_ids=False)
        read_tasks = []
        for chunk in chunks:
            exact = not any(t.delete_files for t in chunk)
            meta = BlockMetadata(
                num_rows=sum(t.file.record_count for t in chunk) if exact else None,
                size_bytes=sum(t.file.file_size_in_bytes for t in chunk) * _INFLATION,
                input_files=tuple(t.file.file_path for t in chunk),
                exec_stats=None,
            )
            read_tasks.append(
                ReadTask(
                    partial(_read_files, chunk, self._metadata, self._io, self._schema),
                    meta,
                    schema=arrow_schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return read_tasks


def exact_row_count(table: Table, plan: RunPlan) -> int | None:
    """Rows the range holds, from the planned files; None when delete files make it inexact."""
    return _exact_rows(list(_scan(table, plan, None).plan_files()))


def _exact_rows(tasks: list[FileScanTask]) -> int | None:
    if any(t.delete_files for t in tasks):
        return None
    return sum(t.file.record_count for t in tasks)
