"""Cutting a run's result rows into chunks, each committed with the run's progress in one ledger commit.

The job hands every finished result row to a ``ChunkCommitter``; every ``ICEBATCH_CHUNK_ROWS`` rows (or
``ICEBATCH_CHUNK_SECONDS``) it writes them into data files and commits them (``ResultsLedger.commit_chunk``,
a compare-and-set on the progress head). The last chunk moves the watermark, once every source row of
the range has its result row. Invariants, whatever is killed when:

- a source row (data file, position) has at most one result row per run: a chunk's rows are checked
  against the rows committed so far (``DoneRows``) before they are written, and again, after reading
  the other attempt's rows, when another attempt of the run committed first (``ProgressRaceError``);
- the watermark moves only with the last chunk, and only when the rows committed are the range's rows;
- a kill loses at most the rows not yet committed: one chunk, plus what the engine had in flight.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icebatch.core.costs.before_job import BeforeJob
from icebatch.core.errors import IncompleteRunError, TaskSpecError, TooManyErrorsError
from icebatch.core.failpoints import failpoint
from icebatch.core.ledger import Chunk, CommitResult, Key, ProgressRaceError, ResultsLedger, RunPlan, RunTotals
from icebatch.core.ledger.results_table import STATUS_ERROR, results_arrow_schema, results_schema, source_id_type
from icebatch.core.task import TaskSpec

from icebatch_job.commit.done import SOURCE_FILE_COLUMN, SOURCE_POS_COLUMN, DoneRows, committed_rows
from icebatch_job.commit.results import STATS_COLUMNS, RunStats, write_data_files

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType

log = logging.getLogger(__name__)


@dataclass
class RunProgress:
    """Where an attempt starts: the run's committed rows (positions and statistics) and the progress head."""

    done: DoneRows
    stats: RunStats
    head: int | None
    chunks: int = 0


# vLLM's words for a request whose structured output it cannot build (vllm.v1.structured_output.backend_guidance,
# VLLMValidationError; no code is carried through Ray Data LLM's error column): a fault of the task, not transient
ENGINE_REFUSALS = ("Grammar error:", "Invalid grammar specification:")


def refused_by_engine(error: str) -> bool:
    """Whether a row's error is vLLM refusing the task's output schema (the same for every row and every retry)."""
    return any(words in error for words in ENGINE_REFUSALS)


def load_progress(ledger: ResultsLedger, plan: RunPlan, task: TaskSpec) -> RunProgress:
    """Nothing for a new run; for a run part way through, the rows its earlier attempts committed."""
    stats, done = RunStats(task.label_fields), DoneRows()
    if plan.resume is None:
        return RunProgress(done, stats, plan.head_snapshot_id)
    results = ledger.results()
    assert results is not None  # chunks were committed to it
    # as the plan saw them (its head): another attempt of the run may have committed since, and this
    # attempt's first commit then loses the race (a conflict) instead of this count looking inconsistent
    rows = _committed(results, plan, task, at=plan.head_snapshot_id)
    stats.observe(rows)
    done.add_table(rows)
    if len(done) != plan.resume.rows_committed:
        raise IncompleteRunError(
            f"run {plan.run_id}: the ledger records {plan.resume.rows_committed} rows committed but its results "
            f"table holds {len(done)} distinct source rows of the run; nothing was started. Fix: `icebatch ledger "
            "reset` (the results table was changed by something other than icebatch)"
        )
    return RunProgress(done, stats, plan.head_snapshot_id, plan.resume.chunks)


def _committed(results: Table, plan: RunPlan, task: TaskSpec, at: int | None = None) -> pa.Table:
    """The run's committed rows, as of snapshot ``at`` (else now)."""
    columns = (SOURCE_FILE_COLUMN, SOURCE_POS_COLUMN, *STATS_COLUMNS, *task.label_fields)
    return committed_rows(results, plan.run_id, plan.task_version, columns, at)


def run_totals(
    plan: RunPlan,
    stats: RunStats,
    redone: int,
    *,
    attempt_seconds: float,
    engine_seconds: float = 0.0,
    started_at: str = "",
    before_job: BeforeJob = BeforeJob(),
    **measured: Any,
) -> RunTotals:
    """The run's totals for a commit: the rows committed (``stats``, earlier attempts' included) and the time
    of every attempt (earlier ones as their last commit recorded it, this one's as measured)."""
    prior = plan.resume
    head = prior.head if prior else None
    return stats.totals(
        engine_seconds=(head.number(Key.ENGINE_SECONDS) if head else 0.0) + engine_seconds,
        job_seconds=(prior.attempt_seconds if prior else 0.0) + attempt_seconds,
        started_at=(head.text(Key.STARTED_AT) if head else "") or started_at,
        attempts=(prior.attempts if prior else 0) + 1,
        rows_redone=(int(head.number(Key.ROWS_REDONE)) if head else 0) + redone,
        **_before_job_fields((head.before_job if head else BeforeJob()) + before_job),
        **measured,
    )


def _before_job_fields(before: BeforeJob) -> dict[str, Any]:
    return {
        "before_job_seconds": before.seconds,
        "before_job_node_seconds": before.node_seconds,
        "before_job_image_seconds": before.image_seconds,
    }


@dataclass(frozen=True)
class Attempt:
    number: int
    id: str
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class ChunkPolicy:
    rows: int
    seconds: float = 0.0  # 0: rows only
    max_inference_error_rate: float = 1.0


class ChunkCommitter:
    """Holds finished result rows and commits them a chunk at a time (see the module docstring).

    ``totals(stats, redone)`` gives the run's totals for a commit (the job adds its timings);
    ``guard()`` is the critical section signals must not interrupt (the job's ``Interrupts.critical``).
    """

    def __init__(
        self,
        ledger: ResultsLedger,
        plan: RunPlan,
        task: TaskSpec,
        *,
        start: RunProgress,
        range_rows: int,
        policy: ChunkPolicy,
        attempt: Attempt,
        totals: Callable[[RunStats, int], RunTotals],
        guard: Callable[[], AbstractContextManager[object]] = nullcontext,
        release: Callable[[int], None] = lambda _rows: None,
        finalize: Callable[[pa.Table], tuple[Any, dict[str, str]]] | None = None,
        source_id: tuple[str, IcebergType] | None = None,
    ) -> None:
        self.ledger, self.plan, self.task = ledger, plan, task
        self.done, self.stats, self.head, self.chunks = start.done, start.stats, start.head, start.chunks
        self.range_rows = range_rows
        self.policy = policy
        self.attempt = attempt
        self.totals = totals
        self.guard = guard
        self.release = release  # rows that left the job's hands (committed, or dropped as done): their permits
        self.finalize = finalize  # the last commit's rows -> what it deletes (a filter) and records
        self.source_id = source_id  # the source id's name and type, for a results table this run creates
        self.table: Table | None = None
        self.schema = results_arrow_schema(task)
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._since = time.monotonic()
        self.received = 0  # result rows handed to this attempt
        self.committed = 0  # ... of which this attempt committed
        self.redone = 0  # ... of which another attempt had committed first
        self.commit_seconds = 0.0  # spent writing and committing chunks before the last: what chunking costs
        self.recorded: RunTotals | None = None  # the run's totals as the last commit recorded them in the ledger

    # --- feeding ----------------------------------------------------------------------------------
    def add(self, rows: pa.Table) -> None:
        """Finished result rows; every full chunk is committed (a chunk is exactly ``policy.rows`` rows)."""
        self.received += rows.num_rows
        self._buffer.append(rows)
        self._buffered += rows.num_rows
        failpoint("chunk.buffered")
        while self._buffered >= self.policy.rows:
            self.commit(final=False, rows=self.policy.rows)
        if self._buffered and self._due():
            self.commit(final=False)

    def _due(self) -> bool:
        """A part-chunk held for ``policy.seconds`` is committed too (a slow engine still makes progress)."""
        p = self.policy
        return p.seconds > 0 and time.monotonic() - self._since >= p.seconds

    @property
    def held(self) -> int:
        return self._buffered

    # --- committing -------------------------------------------------------------------------------
    def finish(self) -> CommitResult:
        """The last chunk: the rows held, and the watermark (once every row of the range is committed)."""
        result = self.commit(final=True)
        assert result is not None
        return result

    def drain(self) -> int:
        """Commit the rows held (the run is stopping); the rows this attempt committed in all."""
        if self._buffered:
            self.commit(final=False)
        return self.committed

    def commit(self, *, final: bool, rows: int | None = None) -> CommitResult | None:
        """Commit the first ``rows`` rows held (default: all of them)."""
        started = time.perf_counter()
        with self.guard():
            result = self._commit(final, rows)
        if not final:
            self.commit_seconds += time.perf_counter() - started
        failpoint("chunk.between")
        return result

    def _take(self, rows: int | None) -> pa.Table:
        """The first ``rows`` rows held, which leave the buffer (the rest stay for the next chunk)."""
        import pyarrow as pa

        held = pa.concat_tables(self._buffer) if self._buffer else self.schema.empty_table()
        taken, rest = (held, held.slice(held.num_rows)) if rows is None else (held.slice(0, rows), held.slice(rows))
        self._buffer, self._buffered, self._since = [rest] if rest.num_rows else [], rest.num_rows, time.monotonic()
        return taken

    def _commit(self, final: bool, rows: int | None) -> CommitResult | None:
        held = self._take(rows)
        result = self._commit_rows(held, final)
        self.release(held.num_rows)
        return result

    def _commit_rows(self, held: pa.Table, final: bool) -> CommitResult | None:
        while True:
            fresh = self._not_done(held)
            stats = copy.deepcopy(self.stats)
            stats.observe(fresh)
            complete = len(self.done) + fresh.num_rows == self.range_rows
            if not fresh.num_rows and not (final and complete):
                return None
            self._check_errors(stats)
            table = self._results_table()
            files = write_data_files(table, self.schema, fresh.to_batches())
            failpoint("chunk.written")
            chunk = Chunk(
                number=self.chunks + 1,
                attempt=self.attempt.number,
                attempt_id=self.attempt.id,
                rows=fresh.num_rows,
                rows_committed=len(self.done) + fresh.num_rows,
                attempt_seconds=self.attempt.seconds,
                final=final and complete,
            )
            redone = self.redone + held.num_rows - fresh.num_rows
            delete, notes = self.finalize(fresh) if chunk.final and self.finalize else (None, {})
            totals = self.totals(stats, redone)
            try:
                result = self.ledger.commit_chunk(
                    self.plan,
                    chunk,
                    files,
                    totals,
                    expected_head=self.head,
                    delete=delete,
                    notes=notes,
                )
            except ProgressRaceError as race:
                self.ledger.discard(files)
                self._catch_up(race)
                continue
            break
        self.head, self.chunks, self.stats, self.redone = result.ledger_snapshot_id, chunk.number, stats, redone
        self.recorded = totals
        self.done.add_table(fresh)
        self.committed += fresh.num_rows
        if final and not complete:
            raise IncompleteRunError(
                f"run {self.plan.run_id}: {len(self.done)} of the range's {self.range_rows} source rows have their "
                "result row; the rows finished were committed, the range stays pending and the next attempt "
                "processes the rest"
            )
        return result

    def _not_done(self, held: pa.Table) -> pa.Table:
        """The held rows less those already committed (and less repeats: one result row per source row)."""
        import numpy as np
        import pyarrow as pa

        files = held.column(SOURCE_FILE_COLUMN).to_pylist()
        positions = held.column(SOURCE_POS_COLUMN).to_pylist()
        committed = self.done.contains(files, np.asarray(positions, dtype=np.int64))
        keep, seen = [], set()
        for name, was_done in zip(zip(files, positions, strict=True), committed, strict=True):
            keep.append(not was_done and name not in seen)
            seen.add(name)
        return held.filter(pa.array(keep, pa.bool_()))

    def _check_errors(self, stats: RunStats) -> None:
        failed = stats.statuses[STATUS_ERROR]
        rate = self.policy.max_inference_error_rate
        if stats.rows and failed / stats.rows > rate:
            if refused_by_engine(str(stats.first_error)):
                raise TaskSpecError(
                    f"the engine's structured output refuses task {self.task.name!r}'s output_schema, the same for "
                    f"every row ({str(stats.first_error)[:300]}); chunk {self.chunks + 1} was not committed and the "
                    "range stays pending. Fix the task's output_schema (`icebatch validate` checks it), then run again"
                )
            raise TooManyErrorsError(
                f"{failed} of the run's {stats.rows} rows failed in the engine/endpoint (more than {rate:.0%}, "
                f"ICEBATCH_MAX_INFERENCE_ERROR_RATE); chunk {self.chunks + 1} was not committed (the {len(self.done)} "
                f"rows committed before stay) and the rest of the range stays pending. First error: "
                f"{str(stats.first_error)[:500]}"
            )

    def _catch_up(self, race: ProgressRaceError) -> None:
        """Another attempt of this run committed chunks: learn which rows, and go on from its head."""
        results = self.ledger.results()
        assert results is not None and race.progress.pending is not None
        rows = _committed(results, self.plan, self.task)
        self.done, self.stats = DoneRows(), RunStats(self.task.label_fields)
        self.done.add_table(rows)
        self.stats.observe(rows)
        self.head, self.chunks = race.progress.head_snapshot_id, race.progress.pending.chunks
        log.warning(
            "run %s: another attempt committed up to chunk %d (%d rows); dropping the rows it holds",
            self.plan.run_id,
            self.chunks,
            len(self.done),
        )

    def _results_table(self) -> Table:
        """The results table (created by the first commit), and the schema rows are written in: its ``source_id``
        type (the rows hold ids as text until then)."""
        if self.table is None:
            name, id_type = self.source_id if self.source_id is not None else (None, None)
            self.table = self.ledger.ensure_results_table(results_schema(self.task, id_type), name)
            self.schema = results_arrow_schema(self.task, source_id_type(self.table.schema()))
        return self.table
