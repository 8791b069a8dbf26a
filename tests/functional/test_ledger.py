"""The incremental protocol on real catalogs: SQL (SQLite) and Glue (moto server over HTTP)."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.errors import (
    ConfigError,
    TableNotFoundError,
    WatermarkConflictError,
    WatermarkError,
)
from icebatch.core.ledger import Key, ResultsLedger
from icebatch.core.ledger import open_ledger as open_consumer_ledger
from icebatch.core.settings import Settings
from icebatch.tools.cli import main as icebatch_main
from icebatch.tools.invoke import invoke
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate, generate_tickets, ticket_schema
from pyiceberg.expressions import EqualTo

from tests.support.consumers import triage
from tests.support.crafted_history import expire_as_iceberg_java
from tests.support.runs import expire_all_but_current, ledger_ids, run_once, source_ids

pytestmark = pytest.mark.functional


def open_ledger(settings: Settings, *, control_plane: bool = False) -> ResultsLedger:
    """The triage consumer's ledger."""
    return open_consumer_ledger(settings, triage(settings), control_plane=control_plane)


class Crash(BaseException):
    """Stands for the process dying at a chosen point."""


def _ledger(settings: Settings) -> ResultsLedger:
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    return open_ledger(settings)


def _append(ledger: ResultsLedger, n: int, seed: int = 1) -> int:
    return append_tickets(ledger.source(), generate_tickets(n, random.Random(seed)))


def _assert_exactly_once(ledger: ResultsLedger) -> None:
    ids = ledger_ids(ledger)
    dupes = [k for k, v in Counter(ids).items() if v > 1]
    assert dupes == [], f"processed more than once: {dupes[:5]}"
    assert sorted(ids) == sorted(source_ids(ledger))


# --------------------------------------------------------------------------------------------------
# backlog
# --------------------------------------------------------------------------------------------------
def test_backlog_of_an_empty_table_is_zero(any_settings: Settings) -> None:
    # given a source table with no snapshot
    ledger = _ledger(any_settings)
    # when / then
    backlog = ledger.backlog()
    assert (backlog.rows, backlog.current_snapshot_id, backlog.watermark_snapshot_id) == (0, None, None)
    assert backlog.oldest_pending_age_seconds() is None
    assert ledger.plan() is None


def test_backlog_counts_appends_after_the_watermark(any_settings: Settings) -> None:
    # given 3 appended snapshots and no watermark yet
    ledger = _ledger(any_settings)
    sids = [_append(ledger, n, seed=n) for n in (5, 7, 11)]
    # then the backlog is every row, the oldest waiting since the first append
    backlog = ledger.backlog()
    assert (backlog.rows, backlog.snapshots, backlog.current_snapshot_id) == (23, 3, sids[-1])
    first_commit = ledger.source().metadata.snapshot_by_id(sids[0]).timestamp_ms
    assert backlog.oldest_pending_commit_ms == first_commit
    # when a run processes them, then nothing is left
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 23
    assert ledger.watermark().source_snapshot_id == sids[-1]
    after = ledger.backlog()
    assert (after.rows, after.oldest_pending_age_seconds()) == (0, None)
    # when two more snapshots land, then only they are the backlog
    _append(ledger, 4, seed=40)
    _append(ledger, 6, seed=60)
    assert ledger.backlog().rows == 10


def test_late_rows_with_older_ingest_times_are_still_processed(any_settings: Settings) -> None:
    # given a processed snapshot of recent tickets
    ledger = _ledger(any_settings)
    _append(ledger, 10, seed=1)
    assert run_once(ledger) is not None
    # when a snapshot arrives whose rows carry older ingested_ms than everything processed
    late = generate_tickets(5, random.Random(2))
    for row in late:
        row["ingested_ms"] = 1_000_000  # 1970: far older than the processed rows
    append_tickets(ledger.source(), late)
    # then it is in the backlog and gets processed
    assert ledger.backlog().rows == 5
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 5
    _assert_exactly_once(ledger)


def test_max_rows_pins_whole_snapshots(settings: Settings) -> None:
    ledger = _ledger(settings)
    sids = [_append(ledger, 10, seed=i) for i in range(4)]
    plan = ledger.plan(max_rows=25)
    assert plan is not None
    assert (plan.to_snapshot_inclusive, plan.expected_rows, plan.snapshots) == (sids[1], 20, 2)
    run_once(ledger, plan=plan)
    assert ledger.backlog().rows == 20
    # a limit smaller than one snapshot still takes one snapshot
    plan = ledger.plan(max_rows=1)
    assert plan is not None and plan.expected_rows == 10


def test_backlog_over_1000_snapshots_opens_no_data_file(settings: Settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # given 1,000 append snapshots, 500 of them processed
    from tests.support.many_snapshots import append_many

    ledger = _ledger(settings)
    sids = append_many(ledger.source(), 1000, lambda rng: rng.randint(1, 3), seed=3)
    half = ledger.plan(to_snapshot_inclusive=sids[499])
    assert half is not None
    run_once(ledger, plan=half)
    # when the backlog is computed through a FileIO that records every file it opens
    counting = settings.with_overrides(catalog_properties={"py-io-impl": "tests.support.counting_io.CountingFileIO"})
    from tests.support.counting_io import CountingFileIO

    CountingFileIO.opened.clear()
    backlog = open_ledger(counting, control_plane=True).backlog()
    # then no data file was opened, and the answer equals a full scan's count
    assert [p for p in CountingFileIO.opened if p.endswith(".parquet")] == []
    assert CountingFileIO.opened, "the counting FileIO was not used"
    processed = set(ledger_ids(ledger))
    unprocessed = [i for i in source_ids(ledger) if i not in processed]
    assert backlog.rows == len(unprocessed) and backlog.snapshots == 500


# --------------------------------------------------------------------------------------------------
# exactly-once effect
# --------------------------------------------------------------------------------------------------
def test_crash_before_the_read_loses_nothing(any_settings: Settings) -> None:
    ledger = _ledger(any_settings)
    _append(ledger, 12)
    plan = ledger.plan()
    assert plan is not None
    # the process dies after planning, before reading: nothing happened; the rerun does everything
    run = run_once(ledger)
    assert run is not None and run.stats.rows == 12
    _assert_exactly_once(ledger)


def test_crash_during_processing_commits_nothing(any_settings: Settings) -> None:
    ledger = _ledger(any_settings)
    for seed in range(3):
        _append(ledger, 8, seed=seed)

    def dies_after_first_batch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield next(batches)
        raise Crash("killed mid-run")

    with pytest.raises(Crash):
        run_once(ledger, transform=dies_after_first_batch)
    assert ledger.watermark().source_snapshot_id is None
    assert ledger_ids(ledger) == []
    run_once(ledger)
    _assert_exactly_once(ledger)


def test_crash_after_writing_results_before_commit(any_settings: Settings) -> None:
    ledger = _ledger(any_settings)
    _append(ledger, 9)

    class DiesBeforeCommit(ResultsLedger):
        def commit_chunk(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise Crash("killed between writing data files and committing")

    crashing = DiesBeforeCommit(ledger.catalog, ledger.consumer)
    with pytest.raises(Crash):
        run_once(crashing)
    # the data files exist but are invisible: no rows, no watermark
    assert ledger_ids(ledger) == [] and ledger.watermark().source_snapshot_id is None
    run_once(ledger)
    _assert_exactly_once(ledger)


@pytest.mark.parametrize("landed", [True, False], ids=["landed-but-response-lost", "not-landed"])
def test_commit_with_unknown_outcome_is_resolved_by_run_id(any_settings: Settings, landed: bool) -> None:
    # given a catalog whose first commit of the ledger fails with an unknown outcome
    ledger = _ledger(any_settings)
    _append(ledger, 7)
    run_once(ledger)  # creates the results table
    _append(ledger, 5, seed=9)
    catalog = ledger.catalog
    real_commit = catalog.commit_table
    calls = {"n": 0}

    def flaky_commit(table, requirements, updates):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if table.name() == tuple(ledger.results_table.split(".")) and calls["n"] == 1:
            if landed:
                real_commit(table, requirements, updates)
            raise ConnectionResetError("connection reset while waiting for the commit response")
        return real_commit(table, requirements, updates)

    catalog.commit_table = flaky_commit  # type: ignore[method-assign]
    try:
        run = run_once(ledger)
    finally:
        del catalog.commit_table
    # then the run ends committed exactly once
    assert run is not None
    assert run.commit.already_committed is landed
    _assert_exactly_once(ledger)


def test_crash_during_commit_after_it_landed(any_settings: Settings) -> None:
    # given a commit that lands, after which the process dies before learning it
    ledger = _ledger(any_settings)
    _append(ledger, 6)
    catalog = ledger.catalog
    real_commit = catalog.commit_table

    def lands_then_dies(table, requirements, updates):  # type: ignore[no-untyped-def]
        response = real_commit(table, requirements, updates)
        if table.name() == tuple(ledger.results_table.split(".")) and any(
            getattr(u, "action", "") == "add-snapshot" for u in updates
        ):
            raise Crash("killed right after the catalog applied the commit")
        return response

    catalog.commit_table = lands_then_dies  # type: ignore[method-assign]
    try:
        with pytest.raises(Crash):
            run_once(ledger)
    finally:
        del catalog.commit_table
    # then the rerun finds nothing new: no duplicates
    assert ledger.plan() is None
    _assert_exactly_once(ledger)


def test_repeated_random_crashes_end_exactly_once(settings: Settings) -> None:
    # given many snapshots and a run that may die at any batch, rerun until done
    ledger = _ledger(settings)
    for seed in range(6):
        _append(ledger, 15, seed=seed)
    rng = random.Random(11)

    def maybe_dies(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if rng.random() < 0.3:
                raise Crash("random crash")
            yield b

    for _ in range(30):
        if ledger.plan(max_rows=30) is None:
            break
        try:
            run_once(ledger, plan=ledger.plan(max_rows=30), transform=maybe_dies)
        except Crash:
            pass
    assert ledger.plan() is None
    _assert_exactly_once(ledger)


# --------------------------------------------------------------------------------------------------
# overlapping runs
# --------------------------------------------------------------------------------------------------
def test_overlapping_runs_one_wins_the_other_reports_a_conflict(settings: Settings) -> None:
    # given two runs planned from the same watermark, the slower one seeing an older snapshot
    ledger = _ledger(settings)
    _append(ledger, 10, seed=1)
    older = ledger.plan()
    _append(ledger, 10, seed=2)
    newer = ledger.plan()
    assert older is not None and newer is not None
    # when the newer one commits first
    won = run_once(ledger, plan=newer)
    assert won is not None
    # then the older one loses, saying from where (no watermark yet: in words), and the watermark stays
    with pytest.raises(
        WatermarkConflictError,
        match=rf"planned from watermark \(none: nothing processed yet\) but run \S+ moved the ledger first "
        rf"\(watermark now {newer.to_snapshot_inclusive}\)",
    ):
        run_once(ledger, plan=older)
    assert ledger.watermark().source_snapshot_id == newer.to_snapshot_inclusive
    _assert_exactly_once(ledger)


@pytest.mark.concurrency
def test_concurrent_commits_race_exactly_one_wins(settings: Settings) -> None:
    # given 4 runs over the same range committing at the same moment (real threads, SQLite CAS)
    ledger = _ledger(settings)
    _append(ledger, 10)
    run_once(ledger)
    _append(ledger, 10, seed=3)
    plans = [ledger.plan() for _ in range(4)]
    barrier = threading.Barrier(4)
    outcomes: list[str] = []
    lock = threading.Lock()

    def go(plan):  # type: ignore[no-untyped-def]
        own = open_ledger(settings)  # each run has its own catalog connection, as separate jobs would

        def synchronised(batches):  # type: ignore[no-untyped-def]
            yield from batches
            barrier.wait(timeout=30)

        try:
            run_once(own, plan=plan, transform=synchronised)
            result = "won"
        except WatermarkConflictError:
            result = "conflict"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=go, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["conflict", "conflict", "conflict", "won"]
    _assert_exactly_once(ledger)


def test_a_stale_launch_range_is_refused(settings: Settings) -> None:
    ledger = _ledger(settings)
    _append(ledger, 3)
    run_once(ledger)
    at = ledger.watermark()
    # when a launch computed before that run asks for the range from no watermark, then it is refused
    with pytest.raises(WatermarkConflictError) as refused:
        ledger.plan(from_snapshot_exclusive=None)
    assert str(refused.value) == (
        f"the launch expected watermark (none: nothing processed yet), but the ledger is at "
        f"{at.source_snapshot_id} (run {at.run_id}): another run already covered this range"
    )


def test_a_first_runs_last_commit_logs_its_watermark_in_words(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a consumer that has processed nothing yet
    ledger = _ledger(settings)
    end = _append(ledger, 3)
    # when its first run commits
    with caplog.at_level(logging.INFO, logger="icebatch.core.ledger.ledger"):
        run_once(ledger)
    # then the log line says it moved from no watermark, not from "None"
    [line] = [r.getMessage() for r in caplog.records if "ledger commit" in r.getMessage()]
    assert f"watermark (none: nothing processed yet) -> {end}" in line and "None" not in line


# --------------------------------------------------------------------------------------------------
# non-append snapshots and history changes
# --------------------------------------------------------------------------------------------------
def test_overwrite_delete_and_replace_snapshots(settings: Settings) -> None:
    from pyiceberg.expressions import EqualTo

    ledger = _ledger(settings)
    _append(ledger, 10, seed=1)
    run_once(ledger)
    table = ledger.source()
    first_id = source_ids(ledger)[0]
    # a row-level delete (copy-on-write) rewrites the other 9 rows in an overwrite snapshot:
    # they are reported as not processed again, not counted as backlog
    table.delete(EqualTo("ticket_id", first_id))
    backlog = ledger.backlog()
    assert backlog.rows == 0 and backlog.skipped_rows == 9
    assert backlog.to_dict()["skipped_snapshots"][0]["operation"] == "overwrite"
    # a whole-table overwrite is a delete plus an append in pyiceberg: the new rows are the backlog
    rows = pa.Table.from_pylist(generate_tickets(4, random.Random(5)), schema=table.schema().as_arrow())
    ledger.source().overwrite(rows)
    assert ledger.backlog().rows == 4
    run_once(ledger)
    # and compaction-style replace snapshots add nothing; appends after them are found as usual
    _append(ledger, 3, seed=7)
    assert ledger.backlog().rows == 3


def test_expired_watermark_snapshot_is_fine_while_its_child_exists(settings: Settings) -> None:
    ledger = _ledger(settings)
    _append(ledger, 4, seed=1)
    run_once(ledger)
    wm = ledger.watermark().source_snapshot_id
    _append(ledger, 5, seed=2)
    _append(ledger, 6, seed=3)
    table = ledger.source()
    table.maintenance.expire_snapshots().by_id(wm).commit()
    assert ledger.source().metadata.snapshot_by_id(wm) is None
    assert ledger.backlog().rows == 11
    run_once(ledger)
    _assert_exactly_once(ledger)


def _labelled_then_unprocessed_expired(ledger: ResultsLedger, deleting: Callable[[], object] = lambda: None) -> None:
    """4 rows labelled; then appends of 5 and 6 rows (``deleting`` after them), and the watermark and the
    first unprocessed append expired."""
    _append(ledger, 4, seed=1)
    run_once(ledger)
    wm = ledger.watermark().source_snapshot_id
    lost = _append(ledger, 5, seed=2)
    _append(ledger, 6, seed=3)
    deleting()
    ledger.source().maintenance.expire_snapshots().by_ids([wm, lost]).commit()


def test_unprocessed_snapshots_expired_are_found_by_sequence_number_and_labelled_once(settings: Settings) -> None:
    from pyiceberg.expressions import In

    # given a watermark, then two appends and a delete of a labelled row, and the watermark plus the first
    # unprocessed append expired (their data files are still live)
    ledger = _ledger(settings)
    _labelled_then_unprocessed_expired(ledger, lambda: ledger.source().delete(In("ticket_id", ledger_ids(ledger)[:1])))
    # when the backlog is computed and the next run goes
    backlog = ledger.backlog()
    run = run_once(ledger)
    # then the backlog counted the rows of live files past the watermark's sequence number (the expired append's
    # among them), and the run labelled those 11 alone, removed the deleted row's verdict, and needs no reset
    assert backlog.gap and backlog.rows >= 11
    assert run is not None and run.stats.rows == 11
    _assert_exactly_once(ledger)
    assert ledger.backlog().rows == 0


def test_a_first_run_over_a_partly_expired_history_labels_every_live_row(settings: Settings) -> None:
    from pyiceberg.expressions import In

    # given a source never processed: an append of 2 rows, one of them updated (copy-on-write: the other is
    # rewritten into a new file by an overwrite), and its history expired but for the current snapshot
    # (found by the lifecycle state machine: the first run read the last append's file alone)
    ledger = _ledger(settings)
    _append(ledger, 2, seed=1)
    kept, changed = sorted(source_ids(ledger))
    ledger.source().delete(In("ticket_id", [changed]))
    _append(ledger, 1, seed=2)
    expire_all_but_current(ledger.source())
    # when the backlog is computed and the first run goes
    backlog = ledger.backlog()
    run = run_once(ledger)
    # then both live rows were counted and labelled, the one in the rewritten file too
    assert backlog.gap and backlog.rows == 2
    assert run is not None and run.stats.rows == 2 and kept in ledger_ids(ledger)
    _assert_exactly_once(ledger)


@pytest.mark.parametrize("java", [False, True], ids=["pyiceberg", "iceberg-java"])
def test_a_v1_source_with_unprocessed_snapshots_expired_loses_no_row(settings: Settings, java: bool) -> None:
    from pyiceberg.expressions import In

    # given a format-v1 source (no sequence numbers) with the watermark and an unprocessed append expired (their
    # files still live), and a labelled row deleted since
    catalog = open_catalog(settings)
    catalog.create_namespace_if_not_exists("support")
    catalog.create_table(settings.catalog.source_table, schema=ticket_schema(), properties={"format-version": "1"})
    ledger = _ledger(settings)
    _append(ledger, 4, seed=1)
    run_once(ledger)
    wm = ledger.watermark().source_snapshot_id
    lost = _append(ledger, 5, seed=2)
    _append(ledger, 6, seed=3)
    ledger.source().delete(In("ticket_id", ledger_ids(ledger)[:1]))
    _expire(ledger, wm, lost, java=java)
    # when the backlog is computed and the next run goes, with no reset
    backlog = ledger.backlog()
    run = run_once(ledger)
    # then the backlog holds every live row to match by content (nothing tells a v1 file's place but its snapshot),
    # and the run labelled the 11 new rows alone, kept the 3 labelled live rows' verdicts and removed the deleted one's
    assert backlog.gap and backlog.rows == 14
    assert run is not None and run.stats.rows == 11
    _assert_exactly_once(ledger)
    assert ledger.backlog().rows == 0


def test_rolled_back_history_is_a_clear_error(settings: Settings) -> None:
    ledger = _ledger(settings)
    first = _append(ledger, 4, seed=1)
    _append(ledger, 4, seed=2)
    run_once(ledger)
    # roll the source back to before the watermark
    table = ledger.source()
    table.manage_snapshots().rollback_to_snapshot(first).commit()
    with pytest.raises(WatermarkError, match="icebatch ledger reset"):
        ledger.backlog()
    # the documented fix works
    ledger.reset(first, reason="source rolled back")
    assert ledger.backlog().rows == 0


def _expire(ledger: ResultsLedger, *snapshot_ids: int, java: bool = False) -> None:
    """These snapshots expired, whatever their place in the history: by pyiceberg, or as Iceberg Java leaves it."""
    if java:
        expire_as_iceberg_java(ledger.source(), list(snapshot_ids))
    else:
        ledger.source().maintenance.expire_snapshots().by_ids(list(snapshot_ids)).commit()


@pytest.mark.parametrize("java", [False, True], ids=["pyiceberg", "iceberg-java"])
def test_a_snapshot_after_the_watermark_expired_out_of_order_loses_no_row(settings: Settings, java: bool) -> None:
    # given a labelled append (the watermark), two more appends, and the first of those expired alone (Spark's
    # expire_snapshots given its id): the history of now is cut short of the watermark, still in the metadata
    ledger = _ledger(settings)
    _append(ledger, 4, seed=1)
    run_once(ledger)
    middle = _append(ledger, 3, seed=2)
    _append(ledger, 2, seed=3)
    _expire(ledger, middle, java=java)
    # when the backlog is computed and a run goes
    backlog = ledger.backlog()
    run = run_once(ledger)
    # then the rows of both appends are new (read matched by content), and every row is labelled exactly once
    assert backlog.gap and backlog.rows == 5
    assert run is not None and run.stats.rows == 5
    assert ledger.backlog().rows == 0
    _assert_exactly_once(ledger)


def _labelled_then_rolled_back(ledger: ResultsLedger) -> int:
    """Two appends, both labelled (the watermark is the second), then the source rolled back to the first: its id."""
    first = _append(ledger, 4, seed=1)
    _append(ledger, 4, seed=2)
    run_once(ledger)
    ledger.source().manage_snapshots().rollback_to_snapshot(first).commit()
    return first


def test_a_rollback_past_the_watermark_is_an_error_when_an_older_snapshot_was_expired_too(settings: Settings) -> None:
    # given a labelled append (the watermark), the source rolled back to before it, one append since, and the
    # snapshot it was rolled back to expired: the history is cut, and cut too close to the watermark to hold it
    ledger = _ledger(settings)
    first = _labelled_then_rolled_back(ledger)
    _append(ledger, 2, seed=3)
    _expire(ledger, first)
    # then it is still the rollback error, with its fix
    with pytest.raises(WatermarkError, match=r"rolled back past it.*icebatch ledger reset"):
        ledger.backlog()


def test_a_rollback_past_the_watermark_then_expired_out_of_order_is_read_by_content(settings: Settings) -> None:
    # given a labelled append (the watermark), the source rolled back to before it, two appends since, and the
    # snapshot rolled back to and the first append since expired: the history cannot say whether the watermark is
    # an ancestor
    ledger = _ledger(settings)
    first = _labelled_then_rolled_back(ledger)
    after = _append(ledger, 3, seed=3)
    _append(ledger, 2, seed=4)
    _expire(ledger, first, after, java=True)
    # when a run goes
    run = run_once(ledger)
    # then what is live is labelled exactly once: the appends since labelled, the rolled back rows' verdicts removed
    assert run is not None
    _assert_exactly_once(ledger)


def _results_expired_past_the_last_run(ledger: ResultsLedger) -> int:
    """A run over 4 tickets, then an operator deleting one result row (a commit that is not icebatch's), then
    the results table's history expired down to that commit. Returns the run's watermark."""
    _append(ledger, 4, seed=1)
    run_once(ledger)
    done = ledger.watermark().source_snapshot_id
    assert done is not None
    results = ledger.results()
    assert results is not None
    results.delete(EqualTo("source_id", results.scan(limit=1).to_arrow()["source_id"][0].as_py()))
    expire_all_but_current(results)
    return done


def test_results_history_expired_to_the_last_watermark_is_fine(settings: Settings) -> None:
    # given two runs, then the results table's history expired down to its current snapshot (the watermark)
    ledger = _ledger(settings)
    _append(ledger, 4, seed=1)
    run_once(ledger)
    _append(ledger, 5, seed=2)
    run_once(ledger)
    results = ledger.results()
    assert results is not None
    expire_all_but_current(results)
    # when more tickets land, then only they are new, and one more run keeps every ticket exactly once
    _append(ledger, 3, seed=3)
    assert ledger.backlog().rows == 3
    run_once(ledger)
    _assert_exactly_once(ledger)


def test_results_history_expired_past_the_watermark_is_a_clear_error(settings: Settings) -> None:
    # given a run, then another writer's commit on the results table (an operator deleting a row), then
    # the results table's history expired down to that commit: no icebatch progress is left in it
    ledger = _ledger(settings)
    done = _results_expired_past_the_last_run(ledger)
    # then the launcher's reading refuses to treat every ticket as new (a run would process them all again)
    with pytest.raises(WatermarkError, match="icebatch ledger reset"):
        ledger.backlog()
    # and the documented fix works: the operator says where the results end
    ledger.reset(done, reason="results table history expired")
    assert ledger.backlog().rows == 0


def test_an_expired_history_without_this_versions_results_is_a_fresh_start(settings: Settings) -> None:
    # given results of task version 1 whose history was expired past its watermark
    ledger = _ledger(settings)
    _results_expired_past_the_last_run(ledger)
    # when the task's version 2 (a backfill) reads its progress, then nothing of it was done: all is new
    task_v2 = ledger.consumer.task.model_copy(update={"version": 2})
    v2 = ResultsLedger(ledger.catalog, ledger.consumer.model_copy(update={"task": task_v2}))
    assert v2.watermark().source_snapshot_id is None
    assert v2.backlog().rows == 4


# the launcher's reading of the same states: control plane, and no pyarrow (the Lambda bundle has none)
LAUNCHER_READ = """
import json, sys
sys.modules["pyarrow"] = None  # as in the Lambda bundle: `import pyarrow` fails
from icebatch.core.consumers import Consumer
from icebatch.core.errors import WatermarkError
from icebatch.core.ledger import open_ledger
from icebatch.core.settings import Settings
ledger = open_ledger(Settings.from_env(), Consumer.model_validate_json(sys.argv[1]), control_plane=True)
try:
    print(json.dumps({"backlog": ledger.backlog().rows}))
except WatermarkError as e:
    print(json.dumps({"error": str(e)}))
"""


def _launcher_reads(settings: Settings, ledger: ResultsLedger, version: int) -> dict[str, Any]:
    consumer = ledger.consumer.model_copy(update={"task": ledger.consumer.task.model_copy(update={"version": version})})
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER_READ, consumer.model_dump_json()],
        capture_output=True,
        text=True,
        env={**os.environ, **settings.job_environment()},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_launcher_reads_a_new_versions_progress_without_pyarrow(any_settings: Settings) -> None:
    # given results of task version 1 and no commit of version 2 (the consumer's task was just bumped)
    ledger = _ledger(any_settings)
    _append(ledger, 4, seed=1)
    run_once(ledger)
    # when the launcher (metadata only, no pyarrow) reads version 2's progress, then all of it is new
    assert _launcher_reads(any_settings, ledger, version=2) == {"backlog": 4}
    # and version 1's is done
    assert _launcher_reads(any_settings, ledger, version=1) == {"backlog": 0}


def test_the_launcher_reads_a_created_but_empty_results_table_without_pyarrow(any_settings: Settings) -> None:
    # given a results table that a first run created and then failed before its first chunk
    from icebatch.core.ledger.results_table import results_schema

    ledger = _ledger(any_settings)
    _append(ledger, 3, seed=1)
    ledger.ensure_results_table(results_schema(ledger.consumer.task))
    # when the launcher reads the progress, then every ticket is new
    assert _launcher_reads(any_settings, ledger, version=1) == {"backlog": 3}


def test_the_launcher_refuses_an_expired_results_history_without_pyarrow(any_settings: Settings) -> None:
    # given results whose history was expired past the last icebatch commit
    ledger = _ledger(any_settings)
    _results_expired_past_the_last_run(ledger)
    # when the launcher reads the progress, then it names the fix rather than seeing every ticket as new
    answer = _launcher_reads(any_settings, ledger, version=1)
    assert "icebatch ledger reset" in answer.get("error", ""), answer
    # and a new task version on the same table is still a fresh start
    assert _launcher_reads(any_settings, ledger, version=2) == {"backlog": 4}


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------
def test_unknown_source_table_names_the_fix(settings: Settings) -> None:
    ledger = open_ledger(settings.with_overrides(source_table="support.nope"))
    with pytest.raises(TableNotFoundError, match="icebatch generate"):
        ledger.backlog()


def test_missing_catalog_settings_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="ICEBATCH_CATALOG_TYPE"):
        Settings.from_env({"ICEBATCH_CATALOG_TYPE": "hive"})
    with pytest.raises(ConfigError, match="ICEBATCH_CATALOG_PROPERTIES must be JSON"):
        Settings.from_env({"ICEBATCH_CATALOG_PROPERTIES": "glue.endpoint=x"})
    with pytest.raises(ConfigError, match="ICEBATCH_CATLOG_TYPE"):
        Settings.from_env({"ICEBATCH_CATLOG_TYPE": "sql"})


def test_glue_catalog_without_a_reachable_endpoint_is_a_clear_error(settings: Settings) -> None:
    from icebatch.core.errors import CatalogUnavailableError

    broken = settings.with_overrides(
        catalog_type="glue",
        catalog_properties={
            "glue.endpoint": "http://127.0.0.1:9",
            "glue.region": "us-east-1",
            "glue.access-key-id": "x",
            "glue.secret-access-key": "y",
            "glue.max-retries": "1",
        },
    )
    with pytest.raises(CatalogUnavailableError, match="cannot reach the glue catalog"):
        open_ledger(broken).backlog()


# What a commit writes is exactly the digits of an Iceberg long; a sign, spaces, underscores, other scripts'
# digits or a number past 2^63-1 is corruption (int() would take each of them as some other snapshot id).
CORRUPT_IDS = ["not-a-snapshot", "-1", "+7", " 42", "1_000", "\u0663", "9" * 40, str(2**63), ""]


def _processed_then(settings: Settings, props: Callable[[dict[str, str]], dict[str, str]]) -> ResultsLedger:
    """A consumer whose first run was processed, then an empty commit with ``props(<that run's summary>)``."""
    ledger = _ledger(settings)
    _append(ledger, 3)
    run_once(ledger)
    results = ledger.results()
    assert results is not None
    newest = results.metadata.current_snapshot()
    assert newest is not None and newest.summary is not None
    summary = dict(newest.summary.additional_properties)
    with results.transaction() as txn, txn.update_snapshot(snapshot_properties=props(summary)).fast_append():
        pass
    return ledger


@pytest.mark.parametrize("value", CORRUPT_IDS)
def test_corrupt_watermark_property_names_the_fix(settings: Settings, value: str) -> None:
    # given a processed run, then a commit whose watermark is not a snapshot id
    ledger = _processed_then(settings, lambda _: {Key.WATERMARK: value, Key.SEQUENCE: "1"})
    # when the backlog is read, then it stops with the value, the snapshot holding it and the fix
    with pytest.raises(
        WatermarkError,
        match=rf"ledger snapshot \d+ holds a corrupt watermark {re.escape(repr(value[:40]))}.*icebatch ledger reset",
    ):
        ledger.backlog()


@pytest.mark.parametrize("value", ["2.0", "-1", "0", "v2", str(2**31), "\u0662"])
def test_a_corrupt_task_version_is_not_taken_as_version_1(settings: Settings, value: str) -> None:
    # given a processed run, then a commit that records progress under a task version that is not one
    ledger = _processed_then(settings, lambda run: {**run, Key.TASK_VERSION: value})
    # when version 1's progress is read, then it stops naming the snapshot and the value, not moving on
    with pytest.raises(WatermarkError, match=r"ledger snapshot \d+ holds a corrupt icebatch.task-version '.*'"):
        ledger.backlog()


def test_a_corrupt_commit_in_the_history_blocks_nothing_once_the_operator_has_reset(
    settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cli_environment: object
) -> None:
    # given a processed run, a commit with a corrupt watermark after it, then the reset its error asks for
    ledger = _processed_then(settings, lambda run: {**run, Key.WATERMARK: "+7"})
    corrupt = ledger.results().metadata.current_snapshot().snapshot_id
    with pytest.raises(WatermarkError, match="icebatch ledger reset"):
        ledger.backlog()
    ledger.reset(ledger.source().metadata.current_snapshot().snapshot_id, reason="after a bad commit")
    _append(ledger, 4, seed=9)
    # when the launcher decides (it reads the runs for its estimate and the day's spend)
    monkeypatch.setenv("ICEBATCH_HOME", str(settings.top.home))  # the CLI below reads this ledger
    response = invoke("launcher", {"action": "launch", "force": True, "dry_run": True, "consumer": "triage"}, settings)
    # then it decides on the new rows, not the old error
    [decision] = response["decisions"]
    assert (decision["decision"], decision["backlog_rows"]) == ("dry_run", 4), response
    # and the runs list the corrupt commit as such, with its figures (the day's spend still counts them)
    runs = ledger.runs()
    [bad] = [r for r in runs if r.ledger_snapshot_id == corrupt]
    assert bad.corrupt is not None and "corrupt watermark '+7'" in bad.corrupt and bad.number(Key.ROWS) == 3
    assert [r.corrupt for r in runs if r.ledger_snapshot_id != corrupt] == [None, None]
    # and a person sees it in `icebatch ledger runs`, while `icebatch report` reports the newest readable run
    assert icebatch_main(["ledger", "runs", "--consumer", "triage"]) == 0
    assert f"unreadable: ledger snapshot {corrupt} holds a corrupt watermark '+7'" in capsys.readouterr().out
    assert icebatch_main(["report", "--consumer", "triage", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 3


def test_a_run_whose_completing_commit_is_unreadable_is_still_found_by_reconciliation(settings: Settings) -> None:
    # given a run, then a commit of the same run id whose watermark is corrupt
    ledger = _processed_then(settings, lambda run: {**run, Key.WATERMARK: "+7"})
    run_id = ledger.runs()[0].run_id
    # when reconciliation asks whether that run completed (a failed RayJob is reported only if not)
    found = ledger.find_run(run_id)
    # then it did, and the record says it is unreadable (the backlog is what reports the corruption)
    assert found is not None and found.run_id == run_id
    assert found.corrupt is not None and "corrupt watermark '+7'" in found.corrupt


def test_generator_cli_path_appends_one_snapshot_per_batch(settings: Settings) -> None:
    ledger = _ledger(settings)
    seen: list[int] = []
    ids = generate(ledger.source(), tickets=25, batches=4, seed=3, on_snapshot=lambda i, n, sid: seen.append(n))
    assert len(ids) == 4 and seen == [7, 6, 6, 6]
    assert ledger.backlog().rows == 25


# --------------------------------------------------------------------------------------------------
# task versions
# --------------------------------------------------------------------------------------------------
def test_a_new_task_version_backfills_the_table_beside_the_old_versions_rows(settings: Settings) -> None:
    # given a consumer whose version 1 has processed every ticket
    v1 = _ledger(settings)
    _append(v1, 12, seed=1)
    _append(v1, 8, seed=2)
    first = run_once(v1)
    assert first is not None and v1.backlog().rows == 0
    # when its task gets version 2
    task_v2 = v1.consumer.task.model_copy(update={"version": 2})
    v2 = ResultsLedger(v1.catalog, v1.consumer.model_copy(update={"task": task_v2}))
    # then the whole table is its backlog (a backfill), while version 1 still has nothing to do
    assert v2.watermark().source_snapshot_id is None and v2.backlog().rows == 20
    assert v1.backlog().rows == 0
    # and running it leaves version 1's rows untouched: each row is there once per version
    second = run_once(v2)
    assert second is not None and second.stats.rows == 20
    rows = v2.results().scan(selected_fields=("source_id", "task_version", "run_id")).to_arrow().to_pylist()
    by_version = Counter((r["source_id"], r["task_version"]) for r in rows)
    assert len(by_version) == 40 and set(by_version.values()) == {1}
    assert {r["run_id"] for r in rows if r["task_version"] == 1} == {first.plan.run_id}
    assert v1.watermark().source_snapshot_id == v2.watermark().source_snapshot_id


def test_an_operator_can_start_a_new_versions_backfill_at_a_named_snapshot(settings: Settings) -> None:
    v1 = _ledger(settings)
    old = _append(v1, 30, seed=3)
    run_once(v1)
    recent = _append(v1, 5, seed=4)
    v2 = ResultsLedger(
        v1.catalog, v1.consumer.model_copy(update={"task": v1.consumer.task.model_copy(update={"version": 2})})
    )
    assert v2.backlog().rows == 35
    v2.reset(old, reason="version 2 only for new tickets")
    backlog = v2.backlog()
    assert (backlog.rows, backlog.pending_snapshot_ids) == (5, (recent,))
    assert v1.backlog().rows == 5  # version 1's own progress is unchanged


def test_a_commit_by_another_writer_to_the_results_table_keeps_the_watermark(settings: Settings) -> None:
    # given a completed run, then a commit to its results table by something else (a maintenance job)
    ledger = _ledger(settings)
    _append(ledger, 6)
    run_once(ledger)
    before = ledger.watermark()
    table = ledger.results()
    assert table is not None and before.source_snapshot_id is not None
    with table.transaction() as txn, txn.update_snapshot(snapshot_properties={"job": "compaction"}).fast_append():
        pass
    # then the watermark is still the run's (pyiceberg's Summary answers None for a missing key, so a
    # membership test on it once took this commit for a watermark of None: every row again)
    assert ledger.watermark() == before and ledger.plan() is None


def test_the_ledger_walks_a_history_as_pyiceberg_does_but_in_linear_time(settings: Settings) -> None:
    from icebatch.core.ledger.lineage import ancestry
    from pyiceberg.table.snapshots import ancestors_of

    # given a source table with a few appends, and a rollback that leaves a snapshot off main's history
    table = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    for seed in range(4):
        append_tickets(table, generate_tickets(3, random.Random(seed)))
    table = open_catalog(settings).load_table(settings.catalog.source_table)
    off_main = table.metadata.current_snapshot_id
    table.manage_snapshots().rollback_to_snapshot(table.metadata.snapshots[1].snapshot_id).commit()
    append_tickets(table, generate_tickets(3, random.Random(9)))
    meta = open_catalog(settings).load_table(settings.catalog.source_table).metadata
    # when its ancestry is walked, then it is pyiceberg's, newest first, without the rolled-back snapshot
    ours = [s.snapshot_id for s in ancestry(meta.current_snapshot(), meta)]
    assert ours == [s.snapshot_id for s in ancestors_of(meta.current_snapshot(), meta)]
    assert off_main not in ours and len(ours) == 3


def test_results_tables_are_created_under_the_warehouse_whatever_the_databases_location(
    glue_settings: Settings, aws_endpoint: str
) -> None:
    from tests.support.aws import client

    # given a Glue database made by Athena or the console, whose LocationUri is outside the warehouse prefix
    # (the deployment's IAM policy grants the job only <warehouse>/<db>.db/...)
    namespace = glue_settings.catalog.source_table.split(".")[0]
    client("s3", aws_endpoint).create_bucket(Bucket="athena-query-results")
    client("glue", aws_endpoint).create_database(
        DatabaseInput={"Name": namespace, "LocationUri": "s3://athena-query-results/somewhere/"}
    )
    ledger = _ledger(glue_settings)
    _append(ledger, 4)
    # when the first run creates the consumer's results table
    run_once(ledger)
    # then it is where the warehouse setting (and the IAM policy) says, not where the database says
    warehouse = glue_settings.catalog_props()["warehouse"]
    name = ledger.results_table.split(".")[1]
    results = ledger.results()
    assert results is not None and results.location() == f"{warehouse}/{namespace}.db/{name}"
    assert ledger_ids(ledger) and sorted(ledger_ids(ledger)) == sorted(source_ids(ledger))
