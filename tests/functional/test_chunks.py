"""Chunked commits on real catalogs: progress that survives a crash, resumes, and stays exactly-once.

The rows are labelled by the rule-based labeller (tests/support/runs.py) through the job's own
``ChunkCommitter`` and ledger; the real job, killed for real, is tests/fault.
"""

from __future__ import annotations

import math
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.errors import TaskSpecError, TooManyErrorsError, WatermarkConflictError, WatermarkError
from icebatch.core.ledger import Key, ResultsLedger, open_ledger
from icebatch.core.settings import Settings
from icebatch.tools.history import completed_from_ledger
from icebatch_job.commit.chunks import Attempt, ChunkCommitter, ChunkPolicy, run_totals
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.plan.source import read_rows
from icebatch_job.plan.work import plan_work
from pyiceberg.io.pyarrow import PyArrowFileIO

from tests.support.consumers import triage
from tests.support.runs import Crash, dies_after, expire_all_but_current, labelled, run_once, source_ids

pytestmark = pytest.mark.functional


def _ledger(settings: Settings, snapshots: int = 5, rows: int = 20) -> ResultsLedger:
    ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    ledger = open_ledger(settings, triage(settings))
    for seed in range(snapshots):
        append_tickets(ledger.source(), generate_tickets(rows, random.Random(seed)))
    return ledger


def _result_rows(ledger: ResultsLedger) -> list[dict]:
    table = ledger.results()
    if table is None:
        return []
    return table.scan(selected_fields=("source_id", "source_file", "source_pos", "run_id")).to_arrow().to_pylist()


def _assert_each_source_row_once(ledger: ResultsLedger) -> None:
    rows = _result_rows(ledger)
    names = Counter((r["source_file"], r["source_pos"]) for r in rows)
    assert [n for n, k in names.items() if k > 1] == []
    assert sorted(r["source_id"] for r in rows) == sorted(source_ids(ledger))


def _ledger_snapshots(ledger: ResultsLedger) -> list[dict[str, str]]:
    table = ledger.results()
    assert table is not None
    return [dict(s.summary.additional_properties) for s in table.metadata.snapshots if s.summary]


def test_a_run_commits_chunk_by_chunk_and_only_the_last_moves_the_watermark(any_settings: Settings) -> None:
    # given 100 rows in 5 snapshots
    ledger = _ledger(any_settings)
    end = ledger.source().metadata.current_snapshot_id
    # when a run commits every 15 rows
    run = run_once(ledger, chunk_rows=15)
    assert run is not None
    # then 7 commits landed, numbered, each with the rows committed so far; only the last moved the watermark
    commits = [s for s in _ledger_snapshots(ledger) if Key.CHUNK in s]
    assert [int(s[Key.CHUNK]) for s in commits] == [1, 2, 3, 4, 5, 6, 7]
    assert [int(s[Key.ROWS_COMMITTED]) for s in commits] == [15, 30, 45, 60, 75, 90, 100]
    assert [Key.WATERMARK in s for s in commits] == [False] * 6 + [True]
    assert {s[Key.RUN_ID] for s in commits} == {run.plan.run_id} and commits[-1][Key.WATERMARK] == str(end)
    # and every source row has exactly one result row, which names it
    _assert_each_source_row_once(ledger)
    assert ledger.watermark().source_snapshot_id == end and ledger.pending() is None
    [record] = ledger.runs()
    assert record.run_id == run.plan.run_id and int(record.number(Key.ROWS)) == 100


def test_a_crashed_run_is_resumed_and_only_the_rest_is_processed(any_settings: Settings) -> None:
    # given a run of 100 rows, chunks of 15, killed after 40 rows
    ledger = _ledger(any_settings)
    end = ledger.source().metadata.current_snapshot_id
    with pytest.raises(Crash):
        run_once(ledger, chunk_rows=15, transform=dies_after(40))
    # then two chunks (30 rows) are committed, the watermark has not moved, and the run is in progress
    pending = ledger.pending()
    assert pending is not None and (pending.rows_committed, pending.chunks, pending.attempts) == (30, 2, 1)
    assert ledger.watermark().source_snapshot_id is None and pending.to_snapshot_inclusive == end
    # when more rows arrive and the run is planned again
    append_tickets(ledger.source(), generate_tickets(7, random.Random(99)))
    plan = ledger.plan()
    # then the plan resumes the same run over the same pinned range, not a new one
    assert plan is not None and plan.resume is not None
    assert (plan.run_id, plan.to_snapshot_inclusive) == (pending.run_id, end)
    # when it runs, then only the 70 rows not committed are labelled, and the totals cover the whole run
    labelled: list[int] = []

    def count(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for b in batches:
            labelled.append(b.num_rows)
            yield b

    run = run_once(ledger, plan=plan, chunk_rows=15, transform=count)
    assert run is not None and sum(labelled) == 70
    _, last = ledger.runs()[0], _ledger_snapshots(ledger)[-1]
    assert (last[Key.ROWS], last[Key.ATTEMPTS], last[Key.CHUNK]) == ("100", "2", str(2 + 5))
    assert ledger.watermark().source_snapshot_id == end
    # and the 7 new rows are the next run's
    assert ledger.backlog().rows == 7 and run_once(ledger) is not None
    _assert_each_source_row_once(ledger)


def test_a_run_whose_first_chunks_were_expired_resumes_exactly_once(any_settings: Settings) -> None:
    # given a completed run, then a second run over 100 new rows, chunks of 15, killed after 40 rows and
    # again after 25 more (3 chunks committed by 2 attempts)
    ledger = _ledger(any_settings)
    run_once(ledger)
    first = ledger.watermark().source_snapshot_id
    for seed in range(10, 15):
        append_tickets(ledger.source(), generate_tickets(20, random.Random(seed)))
    end = ledger.source().metadata.current_snapshot_id
    for rows in (40, 25):
        with pytest.raises(Crash):
            run_once(ledger, chunk_rows=15, transform=dies_after(rows))
    job_seconds = ledger.pending().attempt_seconds  # type: ignore[union-attr]
    # when the results table's history is expired down to its current snapshot (the third chunk): the
    # first run's commit, which held the watermark, and the first attempt's chunks are gone (a long backfill's early
    # commits expire while it still runs); and the source's snapshots up to that watermark expire too
    results = ledger.results()
    assert results is not None
    expire_all_but_current(results)
    source = ledger.source()
    processed = [s.snapshot_id for s in source.metadata.snapshots if s.snapshot_id != end][:5]
    assert processed[-1] == first
    source.maintenance.expire_snapshots().by_ids(processed).commit()
    # then the ledger still sees the run part way through, from the first run's watermark, with its chunks
    # and attempts so far
    pending = ledger.pending()
    assert pending is not None and (pending.rows_committed, pending.chunks, pending.attempts) == (45, 3, 2)
    assert job_seconds - 0.002 <= pending.attempt_seconds < job_seconds + 5  # the newest chunk's total (3 decimals)
    assert (pending.from_snapshot_exclusive, pending.to_snapshot_inclusive) == (first, end)
    assert ledger.watermark().source_snapshot_id == first
    # when the run resumes, then only the rest is processed and every source row has one result
    run = run_once(ledger, chunk_rows=15)
    assert run is not None and run.plan.run_id == pending.run_id and run.stats.rows == 100
    last = _ledger_snapshots(ledger)[-1]
    assert (last[Key.CHUNK], last[Key.ATTEMPTS]) == (str(3 + 4), "3")
    assert ledger.watermark().source_snapshot_id == end and ledger.backlog().rows == 0
    _assert_each_source_row_once(ledger)


def test_a_run_in_progress_is_not_replaced_by_another_range(settings: Settings) -> None:
    # given a run killed part way through (W, T]
    ledger = _ledger(settings)
    with pytest.raises(Crash):
        run_once(ledger, chunk_rows=10, transform=dies_after(25))
    pending = ledger.pending()
    assert pending is not None
    # when a launch for another end snapshot arrives, then it is refused and says which run to resume
    new_end = append_tickets(ledger.source(), generate_tickets(3, random.Random(5)))
    started = rf"over \(start, {pending.to_snapshot_inclusive}\]; this job's range"  # (no watermark before it)
    with pytest.raises(WatermarkConflictError, match=rf"run {pending.run_id}: 20 of 100 rows committed .* {started}"):
        ledger.plan(to_snapshot_inclusive=new_end)


def test_random_crashes_mid_chunk_end_exactly_once_with_bounded_rework(settings: Settings) -> None:
    # given 150 rows and a run that dies at a random row, again and again
    ledger = _ledger(settings, snapshots=6, rows=25)
    rng = random.Random(7)
    labelled = 0
    kills = 0

    def dies_at_random(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
        nonlocal labelled, kills
        for b in batches:
            for one in b.to_batches(max_chunksize=1):
                if rng.random() < 0.04:
                    kills += 1
                    raise Crash("random kill")
                labelled += 1
                yield pa.Table.from_batches([one])

    for _ in range(200):
        if ledger.plan() is None:
            break
        try:
            run_once(ledger, chunk_rows=10, transform=dies_at_random)
        except Crash:
            pass
    # then every row is there once, and each kill cost at most the chunk it interrupted
    assert ledger.plan() is None and kills >= 3
    _assert_each_source_row_once(ledger)
    assert labelled - 150 <= kills * 9  # a chunk commits at 10 rows: at most 9 are held when killed


@pytest.mark.concurrency
def test_two_attempts_of_one_run_at_once_commit_each_row_once(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a run part way through, and two attempts of it started together (a stale retry beside a new one)
    ledger = _ledger(settings, snapshots=4, rows=30)
    with pytest.raises(Crash):
        run_once(ledger, chunk_rows=10, transform=dies_after(15))
    plans = [ledger.plan(), ledger.plan()]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def attempt(i: int) -> None:
        own = open_ledger(settings, triage(settings))  # each attempt has its own catalog connection

        def interleaved(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
            for b in batches:
                for one in b.to_batches(max_chunksize=5):
                    barrier.wait(timeout=30)  # both hold the same rows at the same time
                    yield pa.Table.from_batches([one])
            barrier.abort()

        try:
            run_once(own, plan=plans[i], chunk_rows=10, transform=interleaved)
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # then one attempt completed the run and the other lost only the race for the last commit
    assert len(errors) <= 1 and all(isinstance(e, WatermarkConflictError) for e in errors), errors
    assert ledger.plan() is None
    # and every row is there exactly once: the rows one attempt held that the other had committed were dropped
    _assert_each_source_row_once(ledger)
    assert int(_ledger_snapshots(ledger)[-1][Key.ROWS]) == 120
    assert "another attempt committed up to chunk" in caplog.text


def test_a_lost_race_whose_files_may_not_be_deleted_leaves_them_unlisted_and_each_row_once(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given two attempts that planned one range together (a stale retry beside a new one)
    ledger = _ledger(settings, snapshots=2, rows=10)
    plans = [ledger.plan(), ledger.plan()]
    # and a store that refuses deletes, as S3 refuses the job's role (template.yaml grants it no s3:DeleteObject;
    # pyiceberg raises this for S3's AccessDenied)
    refused: list[str] = []

    def denied(self: PyArrowFileIO, location: object) -> None:
        refused.append(str(getattr(location, "location", location)))
        raise PermissionError(f"Cannot delete file, access denied: {refused[-1]}")

    monkeypatch.setattr(PyArrowFileIO, "delete", denied)

    def the_other_commits_first(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
        held = list(batches)
        assert run_once(open_ledger(settings, triage(settings)), plan=plans[1]) is not None
        yield from held

    # when the other attempt commits the whole range while the first holds its rows
    with pytest.raises(WatermarkConflictError):
        run_once(ledger, plan=plans[0], transform=the_other_commits_first)
    # then the loser's data files stay where they were written, named in a warning, and no snapshot lists them
    assert refused and all(Path(urlsplit(p).path).exists() for p in refused), refused
    assert all(p in caplog.text for p in refused) and "orphan-file removal deletes it" in caplog.text
    results = ledger.results()
    assert results is not None
    listed = {f.file.file_path for f in results.scan().plan_files()}
    assert listed and not listed & set(refused)
    # and every source row has its result exactly once
    _assert_each_source_row_once(ledger)


def test_a_chunk_chain_that_does_not_continue_the_watermark_is_refused(settings: Settings) -> None:
    # given a run in progress, and a chunk of another run appended by some other writer
    ledger = _ledger(settings)
    with pytest.raises(Crash):
        run_once(ledger, chunk_rows=10, transform=dies_after(15))
    table = ledger.results()
    assert table is not None
    props = {**_ledger_snapshots(ledger)[-1], Key.RUN_ID: "someone-else", Key.CHUNK: "2"}
    with table.transaction() as txn, txn.update_snapshot(snapshot_properties=props).fast_append():
        pass
    # then planning stops with the fix instead of mixing the two runs' rows
    with pytest.raises(WatermarkError, match=r"does not continue the watermark.*icebatch ledger reset"):
        ledger.plan()


@pytest.mark.parametrize("key", [Key.RANGE_ROWS, Key.ROWS_COMMITTED, Key.CHUNK])
@pytest.mark.parametrize("value", ["nan", "-5", "1e3", "7.5", "inf"])
def test_a_chunk_with_a_corrupt_position_is_refused(settings: Settings, key: str, value: str) -> None:
    # given a run in progress whose newest chunk records where it stands in a form no commit writes
    ledger = _ledger(settings)
    with pytest.raises(Crash):
        run_once(ledger, chunk_rows=10, transform=dies_after(15))
    table = ledger.results()
    assert table is not None
    props = {**_ledger_snapshots(ledger)[-1], key: value}
    with table.transaction() as txn, txn.update_snapshot(snapshot_properties=props).fast_append():
        pass
    # then planning stops naming the snapshot, the key and the fix, instead of resuming from a guess
    with pytest.raises(WatermarkError, match=rf"ledger snapshot \d+ holds a corrupt {key} '.*'.*icebatch ledger reset"):
        ledger.plan()


def test_a_run_whose_cost_figures_are_unreadable_is_still_reported(settings: Settings) -> None:
    # given a completed run whose commit records cost figures no commit writes (not finite, negative)
    ledger = _ledger(settings, snapshots=1)
    assert run_once(ledger) is not None
    table = ledger.results()
    assert table is not None
    corrupt = {Key.OUTPUT_TOKENS: "inf", Key.ENGINE_SECONDS: "nan", Key.JOB_SECONDS: "-3"}
    props = {**_ledger_snapshots(ledger)[-1], **corrupt}
    with table.transaction() as txn, txn.update_snapshot(snapshot_properties=props).fast_append():
        pass
    # when its report is rebuilt from the ledger (icebatch report)
    report = completed_from_ledger(settings, [ledger.consumer])
    # then the unreadable figures count as missing ones do (0), and the cost stays a real number
    assert report.run_id == ledger.runs()[0].run_id and report.rows == 20
    assert (report.tokens.output, report.engine_seconds) == (0, 0)
    assert math.isfinite(report.cost.lifetime_cost) and report.cost.lifetime_cost >= 0


def test_an_attempt_reads_the_rows_its_plan_saw_while_another_attempt_commits(settings: Settings) -> None:
    from icebatch_job.commit.chunks import load_progress

    # given a run part way through, planned by one attempt
    ledger = _ledger(settings, snapshots=4, rows=30)
    with pytest.raises(Crash):
        run_once(ledger, chunk_rows=10, transform=dies_after(15))
    late = ledger.plan()
    assert late is not None and late.resume is not None and late.resume.rows_committed == 10
    # when another attempt of the run commits more chunks before this one reads its progress
    with pytest.raises(Crash):
        run_once(ledger, plan=ledger.plan(), chunk_rows=10, transform=dies_after(25))
    pending = ledger.pending()
    assert pending is not None and pending.rows_committed > 10
    # then this attempt starts from the rows its plan saw (its first commit will lose the race, a conflict),
    # not from an error calling the results table changed by something other than icebatch
    progress = load_progress(ledger, late, triage(settings).task)
    assert len(progress.done) == 10


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        ("Grammar error: Unsatisfiable schema: required property 'aspect' is unsatisfiable", TaskSpecError),
        ("Invalid grammar specification: unknown format", TaskSpecError),
        ("CUDA error: an illegal memory access was encountered", TooManyErrorsError),
    ],
)
def test_a_schema_the_engine_refuses_ends_the_run_as_a_task_error_not_a_transient_one(
    settings: Settings, error: str, raised: type[Exception]
) -> None:
    # given a range whose every row the engine answered with an error (vLLM's words for a schema it cannot build)
    ledger = _ledger(settings, snapshots=1, rows=10)
    task = ledger.consumer.task
    plan, work = plan_work(ledger, ledger.plan(), task, ledger.source())
    committer = ChunkCommitter(
        ledger,
        plan,
        task,
        start=work.progress,
        range_rows=work.range_rows,
        policy=ChunkPolicy(4, max_inference_error_rate=0.5),
        attempt=Attempt(1, "a1"),
        totals=lambda stats, redone: run_totals(plan, stats, redone, attempt_seconds=0.0, model="m"),
    )
    failed = pa.concat_tables(labelled(plan, read_rows(work.planned, work.skip), task, error=error))
    # when the job hands them to its committer, then a refused schema is the task's fault (permanent: exit 2, no
    # retry), any other engine error stays transient; either way nothing is committed and the range stays pending
    with pytest.raises(raised):
        committer.add(failed)
    assert ledger.results() is None or ledger.results().scan().to_arrow().num_rows == 0
    assert ledger.plan() is not None
