"""``ResultsLedger``: one consumer's progress over its source table, kept in its results table.

A run commits its range in chunks (see the package docstring). Every commit is a compare-and-set on the
**progress head**, the newest commit of the consumer's task version (a chunk, a run's last commit, a
reset): it lands only if the head is still the one the committing attempt last saw. pyiceberg's own
commit retry is switched off for the ledger (it would re-apply the append on top of a competing commit);
instead a failed commit reloads the ledger and either

- retries (an unrelated change: the head did not move),
- reports success (this commit id is already there: the outcome of an earlier try was only unknown),
- raises ``ProgressRaceError`` (another attempt of the *same run* committed chunks first: the caller
  drops the rows they hold and commits the rest), or
- raises ``WatermarkConflictError`` (another run, a reset: this chunk's data files are deleted).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from icebatch.core.catalog import SOURCE_FIX, load_table, open_catalog, table_exists
from icebatch.core.costs.report import range_text, watermark_text
from icebatch.core.errors import (
    CommitOutcomeUnknownError,
    IcebatchError,
    TableNotFoundError,
    WatermarkConflictError,
    WatermarkError,
)
from icebatch.core.failpoints import failpoint
from icebatch.core.ledger.backlog import Backlog, compute_backlog, pin_range_end, same_table, watermark_sequence
from icebatch.core.ledger.columns import SourceColumns, parse_field_ids, resolve_columns
from icebatch.core.ledger.results_table import SOURCE_ID_COLUMN, id_texts, source_id_type, with_id_type
from icebatch.core.ledger.summary import (
    NO_RETRIES,
    NONE,
    Key,
    Pending,
    Progress,
    RunRecord,
    RunTotals,
    Watermark,
    find_commit,
    find_run,
    list_runs,
    read_progress,
    recorded_source,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icebatch.core.consumers import Consumer
    from icebatch.core.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """A pinned range for one run: rows appended in (from_exclusive, to_inclusive]."""

    run_id: str
    consumer: str
    task: str
    task_version: int
    source_table: str
    results_table: str
    from_snapshot_exclusive: int | None  # the watermark the run started from (the commit's CAS value)
    to_snapshot_inclusive: int
    expected_rows: int
    snapshots: int
    scan_from_exclusive: int | None = None  # = from_snapshot_exclusive unless that snapshot was expired
    to_sequence_number: int | None = None
    from_sequence_number: int | None = None  # of from_snapshot_exclusive (recorded: it may be expired later)
    planned_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    resume: Pending | None = None  # the run is part way through: these chunks are committed already
    head_snapshot_id: int | None = None  # the progress head when planned: what the first commit expects
    source_uuid: str | None = None  # the source table planned (recorded with every commit)
    source_format_version: int | None = None
    source_columns: SourceColumns | None = None  # where the task's columns are read (recorded: their field ids)
    match_content: bool = False  # a run closed part way left verdicts of the range: its rows are matched by content
    source_id_upper: str | None = None  # the highest source id up to the watermark, as recorded (``Key``)


@dataclass(frozen=True)
class Chunk:
    """One commit of a run: a share of its result rows, and where the run stands once it lands."""

    number: int  # 1, 2, ... over the run
    attempt: int
    attempt_id: str
    rows: int
    rows_committed: int  # of the range, this chunk included
    attempt_seconds: float
    final: bool  # the run's last commit: it moves the watermark to T

    def commit_id(self, run_id: str) -> str:
        return f"{run_id}/{self.attempt_id}/{self.number}"


@dataclass(frozen=True)
class CommitResult:
    ledger_snapshot_id: int
    attempts: int
    already_committed: bool = False  # an earlier try of this commit had landed


NewSource = Literal["keep-results", "drop-results"]  # ``reset`` onto a replaced source table: the old verdicts


class ProgressRaceError(IcebatchError):
    """Another attempt of the same run committed chunks since this attempt last looked."""

    def __init__(self, progress: Progress) -> None:
        assert progress.pending is not None
        p = progress.pending
        super().__init__(f"another attempt committed up to chunk {p.chunks} of run {p.run_id}")
        self.progress = progress


def new_run_id(consumer: str, now: datetime | None = None) -> str:
    """A sortable, unique run id: ``triage-20261129T073000-3fa9c2``."""
    ts = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
    return f"{consumer}-{ts}-{secrets.token_hex(3)}"


def _snapshot_text(snapshot_id: int | None) -> str:
    return NONE if snapshot_id is None else str(snapshot_id)


class ResultsLedger:
    """One consumer's progress (for its current task version) over one source table.

    Example::

        ledger = ResultsLedger(catalog, consumer)
        plan = ledger.plan()                       # None when nothing is new; plan.resume: part way through
        ...                                        # read the rows not yet done, write a chunk's data files
        ledger.commit_chunk(plan, chunk, files, totals, expected_head=head)  # results + progress, one commit
    """

    def __init__(self, catalog: Catalog, consumer: Consumer) -> None:
        self.catalog = catalog
        self.consumer = consumer
        self.source_table = consumer.source_table
        self.results_table = consumer.results_table

    # --- reading ---------------------------------------------------------------------------------
    def source(self) -> Table:
        return load_table(self.catalog, self.source_table, what="source table", fix=SOURCE_FIX)

    def results(self) -> Table | None:
        if not table_exists(self.catalog, self.results_table):
            return None
        return self.catalog.load_table(self.results_table)

    def progress(self) -> Progress:
        """This task version's progress, from the results table's history (see ``read_progress``).

        Raises ``WatermarkError`` when that history holds no commit of this task version while the table holds
        its results (icebatch writes both in one commit: the history was expired past the last one, or the
        rows were copied in): with no record of what is done, a run would process everything again.
        """
        results = self.results()
        version = self.consumer.task_version
        progress = read_progress(results.metadata if results else None, self.source_table, version)
        if results is not None and progress.head_snapshot_id is None and _has_results_of(results, version):
            raise WatermarkError(
                f"results table {self.results_table!r} holds results of consumer {self.consumer.name!r} (task "
                f"version {version}) but its history no longer has the commit that recorded them (snapshots "
                "expired?): which source rows are done is unknown. When expiring its snapshots, keep the last "
                "icebatch commit (retain_last, or older_than longer than the time between runs); to resume, "
                "choose the last source snapshot whose rows all have results: "
                "`icebatch ledger reset --to-snapshot <id> --reason ...`"
            )
        return progress

    def watermark(self) -> Watermark:
        return self.progress().watermark

    def pending(self) -> Pending | None:
        """The run part way through its range (some chunks committed), if any."""
        return self.progress().pending

    def backlog(
        self, *, upto: int | None = None, source: Table | None = None, watermark: Watermark | None = None
    ) -> Backlog:
        """How much is new, from the source table's metadata (no data file is opened)."""
        source = source or self.source()
        wm = watermark or self.watermark()
        same_table(
            wm.source_uuid,
            wm.source_uuid_at,
            source.metadata,
            source_table=self.source_table,
            consumer=self.consumer.name,
        )
        self.columns(source, wm)  # a task that cannot read the table as it is now: refused here, not in a job
        backlog = compute_backlog(
            source.metadata,
            source.io,
            source_table=self.source_table,
            consumer=self.consumer.name,
            watermark=wm.source_snapshot_id,
            watermark_seq=wm.source_sequence_number,
            upto=upto,
        )
        return replace(backlog, rewrites=True) if wm.closed else backlog  # a closed run's verdicts to reconcile

    def columns(self, source: Table, watermark: Watermark) -> SourceColumns:
        """Where the task's columns are read in the source now (``icebatch.core.ledger.columns``); raises
        ``InvalidTaskError`` for a column missing or dropped."""
        return resolve_columns(source.schema(), self.consumer, watermark.source_field_ids)

    def plan(
        self,
        *,
        run_id: str | None = None,
        from_snapshot_exclusive: int | Literal["watermark"] | None = "watermark",
        to_snapshot_inclusive: int | None = None,
        max_rows: int | None = None,
        source: Table | None = None,
    ) -> RunPlan | None:
        """Pin the range of one run. None when there is nothing to do.

        The launcher passes the range it saw (``from_snapshot_exclusive``/``to_snapshot_inclusive``); if the watermark
        has moved since, the range is stale and WatermarkConflictError says so. A run part way through its range
        (chunks committed, watermark not yet moved) is resumed, whatever the run id asked for: its range stays pinned
        (unless its end snapshot was expired: ``_close``). ``source``: the source table as the caller loaded it (a
        streaming-fed table's metadata takes seconds to load), else loaded here.
        """
        progress = self.progress()
        wm = progress.watermark
        if from_snapshot_exclusive != "watermark" and from_snapshot_exclusive != wm.source_snapshot_id:
            raise WatermarkConflictError(
                f"the launch expected watermark {watermark_text(from_snapshot_exclusive)}, but the ledger is at "
                f"{watermark_text(wm.source_snapshot_id)}{f' (run {wm.run_id})' if wm.run_id else ''}: another run "
                "already covered this range"
            )
        source = source or self.source()
        if (stale := progress.pending) is not None and self.end_expired(stale, source):
            self._close(progress, stale, source)  # a new run from the same watermark takes the rest, up to now
            progress = self.progress()
            wm = progress.watermark
            run_id, to_snapshot_inclusive = (None, None) if run_id == stale.run_id else (run_id, to_snapshot_inclusive)
        if progress.pending is not None:
            return self._resume(progress, progress.pending, to_snapshot_inclusive, source)
        backlog = self.backlog(upto=to_snapshot_inclusive, source=source, watermark=wm)
        # after a close, the range is not cut short (``max_rows``): it must reach past the closed run's end
        end, rows = pin_range_end(backlog, None if wm.closed else max_rows)
        if end is None or (rows == 0 and not backlog.rewrites):
            return None  # nothing appended (a compaction adds no work); a delete or overwrite has verdicts to remove
        ids, end_snapshot = list(backlog.pending_snapshot_ids), source.metadata.snapshot_by_id(end)
        return RunPlan(
            run_id=run_id or new_run_id(self.consumer.name),
            consumer=self.consumer.name,
            task=self.consumer.task.name,
            task_version=self.consumer.task_version,
            source_table=self.source_table,
            results_table=self.results_table,
            from_snapshot_exclusive=wm.source_snapshot_id,
            to_snapshot_inclusive=end,
            expected_rows=rows,
            snapshots=ids.index(end) + 1 if end in ids else len(ids),
            scan_from_exclusive=backlog.scan_from_exclusive,
            to_sequence_number=end_snapshot.sequence_number if end_snapshot else None,
            from_sequence_number=watermark_sequence(source.metadata, wm.source_snapshot_id, wm.source_sequence_number),
            head_snapshot_id=progress.head_snapshot_id,
            source_uuid=str(source.metadata.table_uuid),
            source_format_version=source.metadata.format_version,
            source_columns=self.columns(source, wm),
            match_content=wm.closed,
            source_id_upper=wm.source_id_upper,
        )

    def end_expired(self, pending: Pending, source: Table) -> bool:
        """Whether the run part way through lost its range's end to expiry (``_close`` is the way on)."""
        return source.metadata.snapshot_by_id(pending.to_snapshot_inclusive) is None

    def _close(self, progress: Progress, pending: Pending, source: Table) -> None:
        """End a run part way through whose range's end snapshot was expired, where it was: its committed verdicts
        stand and the watermark stays. The next run's range (from the same watermark, to now: every row added
        since, found by data sequence number) matches rows by content, so those verdicts are not made again and a
        row changed since gets a new one that replaces its old one. Refused, saying what is lost, where the range
        from the watermark cannot be known (a watermark with no sequence number, a rollback past it)."""
        wm = progress.watermark
        try:
            self.backlog(source=source, watermark=wm)
        except WatermarkError as e:
            raise WatermarkError(
                f"{pending.describe()}; its range's end snapshot {pending.to_snapshot_inclusive} was expired, and "
                f"the rows after the watermark cannot be found again ({e}). Its {pending.rows_remaining:,} rows not "
                f"yet labelled are lost to icebatch unless a reset says where to resume"
            ) from e
        reason = (
            f"the range's end snapshot {pending.to_snapshot_inclusive} was expired with "
            f"{pending.rows_committed:,} of {pending.range_rows:,} rows committed: the rest is in the next run's "
            "range"
        )
        table = self.results()
        assert table is not None  # chunks were committed to it
        kept = {k: v for k, v in pending.head.properties.items() if k not in (Key.COMMIT_ID, Key.CHUNK)}
        props = {
            **kept,
            Key.WATERMARK: _snapshot_text(wm.source_snapshot_id),
            Key.SEQUENCE: _snapshot_text(wm.source_sequence_number),
            Key.CLOSED: reason,
        }
        if read_progress(table.metadata, self.source_table, self.consumer.task_version).head_snapshot_id != (
            progress.head_snapshot_id
        ):
            return  # another attempt moved the ledger first (closed it, or committed): planning reads it again
        from pyiceberg.exceptions import CommitFailedException

        txn = table.transaction()
        superseded = superseded_by_run(table, pending.run_id, self.consumer.task_version)
        if superseded:  # what its last commit would have removed: older verdicts of the rows it labelled again
            txn.delete(superseded_filter(superseded, pending.run_id, self.consumer.task_version))
        props[Key.VERDICTS_SUPERSEDED] = str(len(superseded))
        with txn.update_snapshot(snapshot_properties=props).fast_append():
            pass
        try:
            txn.commit_transaction()  # asserts the head it read: a concurrent commit fails it
        except CommitFailedException:
            return
        log.warning("closed run %s: %s", pending.run_id, reason)

    def _resume(
        self, progress: Progress, pending: Pending, to_snapshot_inclusive: int | None, source: Table | None
    ) -> RunPlan:
        if to_snapshot_inclusive is not None and to_snapshot_inclusive != pending.to_snapshot_inclusive:
            started = range_text(pending.from_snapshot_exclusive, pending.to_snapshot_inclusive)
            raise WatermarkConflictError(
                f"{pending.describe()} over {started}; "
                f"this job's range (..., {to_snapshot_inclusive}] was not started. The next launch (or "
                "`icebatch job run` without --to-snapshot) resumes that run"
            )
        source = source or self.source()
        backlog = self.backlog(upto=pending.to_snapshot_inclusive, source=source, watermark=progress.watermark)
        return RunPlan(
            run_id=pending.run_id,
            consumer=self.consumer.name,
            task=self.consumer.task.name,
            task_version=self.consumer.task_version,
            source_table=self.source_table,
            results_table=self.results_table,
            from_snapshot_exclusive=pending.from_snapshot_exclusive,
            to_snapshot_inclusive=pending.to_snapshot_inclusive,
            expected_rows=pending.range_rows,
            snapshots=backlog.snapshots,
            scan_from_exclusive=backlog.scan_from_exclusive,
            to_sequence_number=pending.to_sequence_number,
            from_sequence_number=watermark_sequence(
                source.metadata, progress.watermark.source_snapshot_id, progress.watermark.source_sequence_number
            ),
            resume=pending,
            head_snapshot_id=progress.head_snapshot_id,
            match_content=progress.watermark.closed,  # as the run's first attempt planned it: every attempt alike
            source_uuid=str(source.metadata.table_uuid),
            source_format_version=source.metadata.format_version,
            source_columns=self.columns(source, progress.watermark),
            source_id_upper=progress.watermark.source_id_upper,
        )

    def runs(self) -> list[RunRecord]:
        results = self.results()
        return list_runs(results.metadata if results else None)

    def find_run(self, run_id: str) -> RunRecord | None:
        results = self.results()
        return find_run(results.metadata if results else None, run_id)

    # --- writing ---------------------------------------------------------------------------------
    def ensure_results_table(self, schema: Schema, id_column: str | None = None) -> Table:
        """Create the results table (or add new columns to it). Turns pyiceberg's commit retry off. ``id_column``:
        the source's name for ``source_id``, a property of a new table. A table that exists keeps its ``source_id``
        (text in one made before ids kept their type)."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        namespace = self.results_table.split(".")[0]
        if not self.catalog.namespace_exists(namespace):  # creating an existing one needs glue:CreateDatabase
            self.catalog.create_namespace_if_not_exists(namespace)
        props = {**NO_RETRIES, Key.CONSUMER: self.consumer.name, Key.SOURCE_TABLE: self.source_table}
        if id_column is not None:
            props[SOURCE_ID_COLUMN] = id_column
        # Look before creating: a create writes a metadata file first, which an "already exists" orphans.
        if table_exists(self.catalog, self.results_table):
            table = self.catalog.load_table(self.results_table)
        else:
            try:
                table = self.catalog.create_table(
                    self.results_table, schema, location=self._results_location(), properties=props
                )
            except TableAlreadyExistsError:  # a concurrent run created it first
                table = self.catalog.load_table(self.results_table)
        schema = with_id_type(schema, source_id_type(table.schema()))
        missing = [f.name for f in schema.fields if table.schema().find_field(f.name, case_sensitive=False) is None]
        if missing:
            log.info("adding columns %s to %s", missing, self.results_table)
            with table.update_schema() as update:
                update.union_by_name(schema)
            table = self.catalog.load_table(self.results_table)
        if table.properties.get("commit.retry.num-retries") != "0":
            log.warning("turning pyiceberg's automatic commit retry off for %s", self.results_table)
            with table.transaction() as txn:
                txn.set_properties(NO_RETRIES)
            table = self.catalog.load_table(self.results_table)
        return table

    def _results_location(self) -> str | None:
        """``<warehouse>/<namespace>.db/<table>``, what the deployment's IAM policy grants, whatever the database's
        own location says (pyiceberg's default puts a new table under the Glue database's ``LocationUri``, which a
        database made by Athena or the console points elsewhere). No warehouse configured, or one that is not a
        location (a REST catalog's warehouse names it: S3 Tables' is the table bucket's ARN, and S3 Tables places
        its tables itself): the catalog's default."""
        warehouse = self.catalog.properties.get("warehouse")
        if not warehouse or "://" not in warehouse:
            return None
        namespace, name = self.results_table.rsplit(".", 1)
        return f"{warehouse.rstrip('/')}/{namespace}.db/{name}"

    def _keys(self, plan: RunPlan) -> dict[str, str]:
        return {
            Key.FROM_SNAPSHOT: _snapshot_text(plan.from_snapshot_exclusive),
            Key.FROM_SEQUENCE: _snapshot_text(plan.from_sequence_number),
            Key.RANGE_END: str(plan.to_snapshot_inclusive),
            Key.RANGE_END_SEQUENCE: _snapshot_text(plan.to_sequence_number),
            Key.RANGE_ROWS: str(plan.expected_rows),
            Key.SOURCE_TABLE: plan.source_table,
            Key.CONSUMER: plan.consumer,
            Key.TASK: plan.task,
            Key.TASK_VERSION: str(plan.task_version),
            Key.RUN_ID: plan.run_id,
            **({Key.SOURCE_UUID: plan.source_uuid} if plan.source_uuid else {}),
            **({Key.SOURCE_FORMAT_VERSION: str(plan.source_format_version)} if plan.source_format_version else {}),
            **({Key.SOURCE_FIELD_IDS: plan.source_columns.summary_value()} if plan.source_columns else {}),
        }

    def _chunk_keys(self, plan: RunPlan, chunk: Chunk) -> dict[str, str]:
        props = {
            **self._keys(plan),
            Key.CHUNK: str(chunk.number),
            Key.ATTEMPT: str(chunk.attempt),
            Key.ATTEMPT_ID: chunk.attempt_id,
            Key.ATTEMPT_SECONDS: f"{chunk.attempt_seconds:.3f}",
            Key.ROWS_COMMITTED: str(chunk.rows_committed),
            Key.COMMIT_ID: chunk.commit_id(plan.run_id),
        }
        if chunk.final:
            props[Key.WATERMARK] = str(plan.to_snapshot_inclusive)
            props[Key.SEQUENCE] = _snapshot_text(plan.to_sequence_number)
        return props

    def commit_chunk(
        self,
        plan: RunPlan,
        chunk: Chunk,
        data_files: Sequence[DataFile],
        totals: RunTotals,
        *,
        expected_head: int | None,
        max_attempts: int = 5,
        delete: BooleanExpression | None = None,
        notes: Mapping[str, str] | None = None,
    ) -> CommitResult:
        """Append a chunk's results (the final one also moves the watermark W -> T), iff the head is unmoved.

        ``delete``: result rows the same commit removes (verdicts of deleted or changed source rows); ``notes``:
        more summary properties of the commit.

        ``totals`` are the run's so far, this chunk included. Raises ProgressRaceError when another
        attempt of this run committed first (the data files are left to the caller), WatermarkConflictError
        when another run or a reset did (the data files are deleted), CommitOutcomeUnknownError when the
        catalog kept failing in ways that leave the outcome unknown and looking did not settle it.
        """
        props = {**self._chunk_keys(plan, chunk), **totals.summary(), **(notes or {})}
        last_error: Exception | None = None
        for attempt in range(1, max_attempts + 1):
            done, last_error = self._try_commit(plan, chunk, data_files, props, expected_head, attempt, delete)
            if done is not None:
                return done
        results = self.results()
        landed = find_commit(results.metadata if results else None, chunk.commit_id(plan.run_id))
        if landed is not None:
            return CommitResult(landed.ledger_snapshot_id, max_attempts, already_committed=True)
        raise CommitOutcomeUnknownError(
            f"could not commit chunk {chunk.number} of run {plan.run_id} after {max_attempts} attempts (last "
            f"error: {last_error!r}); its rows are still pending and will be processed again by the next attempt"
        ) from last_error

    def _try_commit(
        self,
        plan: RunPlan,
        chunk: Chunk,
        data_files: Sequence[DataFile],
        props: dict[str, str],
        expected_head: int | None,
        attempt: int,
        delete: BooleanExpression | None = None,
    ) -> tuple[CommitResult | None, Exception | None]:
        """One try: (the result, None) when settled, (None, the error) when worth trying again."""
        from pyiceberg.exceptions import CommitFailedException

        table = self.results()
        if table is None:
            raise TableNotFoundError(f"results table {self.results_table!r} disappeared during the run; rerun the job")
        done = find_commit(table.metadata, chunk.commit_id(plan.run_id))
        if done is not None:  # an earlier try landed; only its answer was lost
            return CommitResult(done.ledger_snapshot_id, attempt, already_committed=True), None
        self._check_head(
            plan, chunk, data_files, read_progress(table.metadata, self.source_table, plan.task_version), expected_head
        )
        txn = table.transaction()
        if delete is not None:  # copy-on-write: the results files holding those rows are rewritten in this commit
            txn.delete(delete)
        with txn.update_snapshot(snapshot_properties=props).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
        failpoint("commit.before")
        try:
            txn.commit_transaction()
        except CommitFailedException as e:  # a stale base: the next try re-checks the head
            log.info("ledger commit try %d lost a race (%s); re-checking the progress head", attempt, e)
            return None, e
        except Exception as e:  # outcome unknown: the catalog may or may not have applied it
            log.warning("ledger commit try %d failed with an unknown outcome: %r", attempt, e)
            time.sleep(min(0.2 * 2**attempt, 5.0))
            return None, e
        failpoint("commit.after")
        landed = find_commit(self.catalog.load_table(self.results_table).metadata, chunk.commit_id(plan.run_id))
        if landed is None:  # pragma: no cover - a catalog that acknowledges and loses a commit
            raise CommitOutcomeUnknownError(f"commit of run {plan.run_id} acknowledged but not visible")
        log.info(
            "ledger commit: run %s chunk %d (%d rows, %d of %d committed)%s (ledger snapshot %d)",
            plan.run_id,
            chunk.number,
            chunk.rows,
            chunk.rows_committed,
            plan.expected_rows,
            f", watermark {watermark_text(plan.from_snapshot_exclusive)} -> {plan.to_snapshot_inclusive}"
            if chunk.final
            else "",
            landed.ledger_snapshot_id,
        )
        return CommitResult(landed.ledger_snapshot_id, attempt), None

    def _check_head(
        self, plan: RunPlan, chunk: Chunk, data_files: Sequence[DataFile], now: Progress, expected: int | None
    ) -> None:
        """The compare of compare-and-set: the head the attempt last saw must still be the head."""
        if now.head_snapshot_id == expected:
            return
        p = now.pending
        same_run = (
            now.watermark.source_snapshot_id == plan.from_snapshot_exclusive
            and p is not None
            and (p.run_id, p.to_snapshot_inclusive) == (plan.run_id, plan.to_snapshot_inclusive)
        )
        if same_run:
            raise ProgressRaceError(now)
        self.discard(data_files)
        by = f"run {p.run_id} (part way through its range)" if p else f"run {now.watermark.run_id}"
        raise WatermarkConflictError(
            f"run {plan.run_id} planned from watermark {watermark_text(plan.from_snapshot_exclusive)} but {by} moved "
            f"the ledger first (watermark now {watermark_text(now.watermark.source_snapshot_id)}); this chunk's "
            f"{chunk.rows} result rows were discarded (that range is someone else's)"
        )

    def reset(self, to_snapshot_id: int | None, *, reason: str, new_source: NewSource | None = None) -> int:
        """Record a new watermark (for the current task version) without results: an operator's move.

        The commit records the source table it was made on. When that table is not the one the ledger follows
        (dropped and created again: another UUID), ``new_source`` says so explicitly and what becomes of the
        old table's verdicts: ``keep-results``, or ``drop-results`` (deleted in the same commit).
        """
        from pyiceberg.expressions import EqualTo

        table = self.results()
        if table is None:
            raise TableNotFoundError(
                f"results table {self.results_table!r} does not exist yet: run the job once (or "
                "`icebatch job run --limit 1`) before moving its watermark"
            )
        source = self.source()
        # not ``progress()``: a reset is the fix for the histories it refuses (expired, corrupt)
        recorded, at, field_ids = recorded_source(table.metadata, self.consumer.task_version) or (None, None, None)
        if new_source is None:
            same_table(recorded, at, source.metadata, source_table=self.source_table, consumer=self.consumer.name)
        elif recorded == str(source.metadata.table_uuid):
            raise WatermarkError(
                f"--new-source is for a source table that was replaced, but {self.source_table!r} is still the table "
                f"consumer {self.consumer.name!r} follows (UUID {recorded}): leave --new-source out"
            )
        target = source.metadata.snapshot_by_id(to_snapshot_id) if to_snapshot_id is not None else None
        plan = RunPlan(
            run_id=f"reset-{int(time.time())}-{secrets.token_hex(2)}",
            consumer=self.consumer.name,
            task=self.consumer.task.name,
            task_version=self.consumer.task_version,
            source_table=self.source_table,
            results_table=self.results_table,
            from_snapshot_exclusive=None,
            to_snapshot_inclusive=0,
            expected_rows=0,
            snapshots=0,
            to_sequence_number=target.sequence_number if target is not None else None,
            source_uuid=str(source.metadata.table_uuid),
            source_format_version=source.metadata.format_version,
            source_columns=self._columns_now(source, field_ids if new_source is None else None, at),
        )
        props = {
            **self._keys(plan),
            Key.WATERMARK: _snapshot_text(to_snapshot_id),
            Key.SEQUENCE: _snapshot_text(plan.to_sequence_number),
            Key.RESET_REASON: reason,
        }
        txn = table.transaction()
        if new_source == "drop-results":  # the old table's verdicts go in the commit that leaves it
            txn.delete(EqualTo(term="task_version", value=self.consumer.task_version))
        with txn.update_snapshot(snapshot_properties=props).fast_append():
            pass
        txn.commit_transaction()
        refreshed = self.results()
        assert refreshed is not None and refreshed.metadata.current_snapshot_id is not None
        return refreshed.metadata.current_snapshot_id

    def _columns_now(self, source: Table, field_ids: str | None, at: int | None) -> SourceColumns:
        """What a reset records of the task's columns: those still found (by recorded field id, else by name);
        a dropped one is left out, so that the next run reads a column added since under its name."""
        try:
            recorded = parse_field_ids(field_ids, where=f"ledger snapshot {at}")
        except WatermarkError:
            recorded = None  # a reset is the fix for a corrupt record too
        return resolve_columns(source.schema(), self.consumer, recorded, lenient=True)

    def discard(self, data_files: Sequence[DataFile]) -> None:
        """Delete data files of a run that will not be committed (best effort: orphans are harmless).

        The job's role on AWS may not delete (template.yaml grants it no ``s3:DeleteObject``): there the files
        stay, listed by no snapshot, until the table's orphan-file removal deletes them.
        """
        table = self.results()
        if table is None:
            return
        for f in data_files:
            try:
                table.io.delete(f.file_path)
            except OSError as e:
                log.warning(
                    "discarded data file %s left in place (%s): no snapshot lists it; the table's orphan-file "
                    "removal deletes it",
                    f.file_path,
                    e,
                )


def _has_results_of(results: Table, task_version: int) -> bool:
    """Whether the results table holds rows of ``task_version``: from its metadata, no data file is opened
    (the launcher reads it, and the Lambda bundle has no pyarrow).

    Scan planning keeps the data files whose column bounds may hold the version. icebatch writes one task
    version per data file (bounds: that version alone), so a kept file holds its rows; a file rewritten by
    another writer across versions, or with rows removed by delete files, is taken to hold them too (the
    caller's error names the fix; a new version, higher than every written one, is never such a file).
    """
    from pyiceberg.expressions import EqualTo

    if results.current_snapshot() is None:
        return False
    scan = results.scan(row_filter=EqualTo(term="task_version", value=task_version))
    return any(task.file.record_count > 0 for task in scan.plan_files())


def superseded_filter(ids: Sequence[str], run_id: str, task_version: int) -> BooleanExpression:
    """The verdicts of ``task_version`` of these source ids (as text: pyiceberg binds them to ``source_id``'s type)
    from runs other than ``run_id``: those a verdict of ``run_id`` supersedes (the row changed, and that run
    labelled it again)."""
    from pyiceberg.expressions import And, EqualTo, In, NotEqualTo

    equal_to: Any = EqualTo  # the pydantic mypy plugin misreads these expressions' own __init__
    not_equal_to: Any = NotEqualTo
    is_in: Any = In
    return And(equal_to("task_version", task_version), And(is_in("source_id", ids), not_equal_to("run_id", run_id)))


def superseded_by_run(table: Table, run_id: str, task_version: int) -> list[str]:
    """The source ids that run ``run_id`` labelled and another run of ``task_version`` has a verdict of too."""
    from pyiceberg.expressions import And, EqualTo

    equal_to: Any = EqualTo
    mine = table.scan(
        row_filter=And(equal_to("run_id", run_id), equal_to("task_version", task_version)),
        selected_fields=("source_id",),
    ).to_arrow()
    ids = sorted(set(id_texts(mine.column(0)).to_pylist()))
    if not ids:
        return []
    others = table.scan(row_filter=superseded_filter(ids, run_id, task_version), selected_fields=("source_id",))
    return sorted(set(id_texts(others.to_arrow().column(0)).to_pylist()))


def open_ledger(settings: Settings, consumer: Consumer, *, control_plane: bool = False) -> ResultsLedger:
    """The ledger of a consumer (``control_plane=True``: metadata reads without pyarrow)."""
    return ResultsLedger(open_catalog(settings, control_plane=control_plane), consumer)
