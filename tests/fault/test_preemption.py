"""Preemption-safe progress with the real job killed for real: SIGKILL at every point, SIGTERM, two attempts,
and a job that stops itself when its engine stops answering.

Each attempt is ``python -m icebatch_job run`` in its own process tree (Ray included), with the pod's
environment, against vLLM's OpenAI server (the endpoint engine mode); the counting proxy in front of the
server measures the work done, so the work redone by each kill is measured, not assumed.
"""

from __future__ import annotations

import json
import random
import re
import signal
import time
from collections import Counter
from typing import Any

import psutil
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.ledger import ResultsLedger, open_ledger
from icebatch.core.settings import Settings
from icebatch_job.commit.window import commit_every
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.stages.pipeline import in_flight_rows

from tests.fault.conftest import Endpoint
from tests.support.consumers import consumers_file
from tests.support.fault_proxy import fault_proxy
from tests.support.job_process import JobProcess, start_job
from tests.support.live_rows import live_rows

pytestmark = [pytest.mark.fault]
POINTS = ("read", "chunk.buffered", "chunk.written", "commit.before", "commit.after", "chunk.between")
SEED = 20261129


def _consumer(s: Settings) -> Consumer:
    return consumer_named(load_consumers(s), "triage")


def _ledger(s: Settings) -> ResultsLedger:
    return open_ledger(s, _consumer(s))


def _tickets(s: Settings, n: int, seed: int) -> None:
    append_tickets(
        ensure_source_table(open_catalog(s), s.catalog.source_table), generate_tickets(n, random.Random(seed))
    )


def _committed(ledger: ResultsLedger) -> list[tuple[str, int]]:
    table = ledger.results()
    if table is None:
        return []
    rows = table.scan(selected_fields=("source_file", "source_pos")).to_arrow().to_pylist()
    return [(r["source_file"], r["source_pos"]) for r in rows]


def _source_rows(ledger: ResultsLedger) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for task in ledger.source().scan().plan_files():
        out.update((task.file.file_path, i) for i in range(task.file.record_count))
    return out


def _watermark_sequence(ledger: ResultsLedger) -> int:
    wm = ledger.watermark().source_snapshot_id
    snap = ledger.source().metadata.snapshot_by_id(wm) if wm is not None else None
    return snap.sequence_number if snap is not None and snap.sequence_number is not None else 0


def _check(ledger: ResultsLedger, last_sequence: int) -> int:
    """The invariants after any kill: no source row twice, nothing not from the source, no regression."""
    committed = _committed(ledger)
    twice = [k for k, n in Counter(committed).items() if n > 1]
    assert twice == [], f"source rows committed twice: {twice[:5]}"
    assert set(committed) <= _source_rows(ledger)
    sequence = _watermark_sequence(ledger)
    assert sequence >= last_sequence, "the watermark went backwards"
    return sequence


def _events(s: Settings) -> list[dict]:
    path = s.home / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _the_event(s: Settings, detail_type: str) -> dict:
    """The detail of the one event of this type the job emitted."""
    [detail] = [e["detail"] for e in _events(s) if e["detail-type"] == detail_type]
    return dict(detail)


def _cadence(s: Settings) -> int:
    """Finished rows per commit (the rest of a chunk is the pipeline's rows in flight)."""
    return commit_every(s.progress.chunk_rows, in_flight_rows(s))


@pytest.mark.timeout(2700)  # some 10 job starts; in make test it shares two cores with every other tier
def test_sigkill_at_every_point_loses_nothing_and_redoes_at_most_a_chunk(
    job_settings: Settings, endpoint: Endpoint
) -> None:
    # given a commit every 36 finished rows, new tickets whenever a run ends, and each point as a kill point, at its
    # first reach or its second (then with a chunk committed before it in the attempt), alternately, in an order
    # drawn at random (commit.before and commit.after at their 2nd to 4th reach are the lingering and shared jobs'
    # kill points below)
    s, rng = job_settings, random.Random(SEED)
    kills = [f"{point}@{1 + i % 2}" for i, point in enumerate(POINTS)]
    rng.shuffle(kills)
    most = 3 * len(kills)  # an attempt may finish its run before its point comes (a resumed run's last file)
    _tickets(s, 90, seed=1)
    ledger = _ledger(s)
    sequence, attempts, redone = 0, 0, []
    while kills:
        attempts += 1
        assert attempts <= most, f"{kills} not reached in {most} attempts (seed {SEED})"
        if ledger.pending() is None and ledger.backlog().rows < 100:  # enough for any point of a new run
            for part in range(2):  # two snapshots: a range of several files and chunks
                _tickets(s, 50, seed=1000 * attempts + part)
        # when an attempt runs until it reaches the point, and the whole process tree is SIGKILLed there
        requests, committed = endpoint.counts["requests"], len(_committed(ledger))
        job = start_job(s, _consumer(s), failpoint=kills[0], tag=f"kill{attempts}")
        if job.wait_for_failpoint() is None:  # the attempt finished what was left of a run first
            assert job.wait() == 0, job.output()[-3000:]
        else:
            job.kill_tree()
            kills.pop(0)
            # then what it did beyond what it committed is at most one chunk
            redone.append(endpoint.counts["requests"] - requests - (len(_committed(ledger)) - committed))
        # and nothing is duplicated or invented, and the watermark never regresses
        sequence = _check(ledger, sequence)
    # when a last attempt runs without a failpoint
    job = start_job(s, _consumer(s), tag="final")
    assert job.wait() == 0, job.output()[-3000:]
    # then every source row has exactly one result row, and the ledger has nothing pending
    assert sorted(_committed(ledger)) == sorted(_source_rows(ledger)), f"seed {SEED}"
    assert ledger.plan() is None
    # and no kill cost more than one chunk of work
    assert max(redone) <= s.progress.chunk_rows, f"redone per kill {redone} (seed {SEED})"


@pytest.mark.parametrize("hit", [1, 6])
def test_sigterm_commits_the_finished_rows_and_reports_a_resumable_failure(
    job_settings: Settings, endpoint: Endpoint, hit: int
) -> None:
    # given an attempt paused mid-chunk, holding finished rows it has not committed
    s = job_settings
    _tickets(s, 100, seed=2)
    ledger = _ledger(s)
    job = start_job(s, _consumer(s), failpoint=f"chunk.buffered@{hit}", tag="term")
    assert job.wait_for_failpoint() is not None
    before = len(_committed(ledger))
    # when it gets SIGTERM (a spot interruption notice)
    job.signal(signal.SIGTERM)
    # then it exits as interrupted, having committed every row it had finished
    assert job.wait(120) == 130, job.output()[-3000:]
    assert "icebatch-job: interrupted: by SIGTERM; the next attempt resumes the run" in job.output()
    failed = _the_event(s, "Batch Job Failed")
    committed = len(_committed(ledger))
    assert committed == failed["rows_committed"] == failed["rows_processed"] > before
    assert committed % _cadence(s) != 0  # the part-chunk in hand was committed, not dropped
    assert failed["resumable"] is True and failed["retryable"] is True and "interrupted" in failed["reason"]
    assert failed["stage"] == "inference"  # where it stopped, not the commit that saved its rows
    # and the next attempt does only the rest
    requests = endpoint.counts["requests"]
    resumed = start_job(s, _consumer(s), tag="resume")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert resumed.result()["status"] == "completed"  # --json: stdout is the one summary, Ray's chatter elsewhere
    assert endpoint.counts["requests"] - requests == 100 - committed
    assert sorted(_committed(ledger)) == sorted(_source_rows(ledger))
    completed = _the_event(s, "Batch Job Completed")
    assert (completed["rows"], completed["attempts"]) == (100, 2)


def test_an_in_process_job_stops_on_ctrl_c_as_the_job_process_does(job_settings: Settings) -> None:
    # given `icebatch launch` running its job in its own process (the embedded default), paused mid-chunk
    # with finished rows it has not committed
    s = job_settings
    _tickets(s, 100, seed=5)
    ledger = _ledger(s)
    launch = start_job(s, _consumer(s), failpoint="chunk.buffered@6", tag="launch", launch=True)
    assert launch.wait_for_failpoint() is not None
    # when the person who started it presses Ctrl-C
    launch.signal(signal.SIGINT)
    # then it exits as interrupted, having committed the rows it had finished, and says the run resumes
    assert launch.wait(120) == 130, launch.output()[-3000:]
    assert launch.result()["error"] == {
        "exit_status": 130,
        "type": "JobInterrupted",
        "message": "by SIGINT; the next attempt resumes the run",
    }
    failed = _the_event(s, "Batch Job Failed")
    committed = len(_committed(ledger))
    assert committed == failed["rows_committed"] == failed["rows_processed"] > 0
    assert failed["resumable"] is True and "interrupted" in failed["reason"]
    # and the next launch resumes the run: every row exactly once
    again = start_job(s, _consumer(s), tag="launch-again", launch=True)
    assert again.wait() == 0, again.output()[-3000:]
    assert sorted(_committed(ledger)) == sorted(_source_rows(ledger))
    completed = _the_event(s, "Batch Job Completed")
    assert (completed["rows"], completed["attempts"]) == (100, 2)


@pytest.mark.parametrize("answered", [0, 40])
def test_a_job_whose_engine_stops_answering_stops_itself_and_loses_nothing(
    job_settings: Settings, endpoint: Endpoint, answered: int
) -> None:
    # given an engine that answers the first `answered` requests and then nothing (0: it never answers),
    # and a job that waits at most 20 s for a result (45 s where a first result must come first: on a loaded
    # machine Ray's start alone, part of the first wait, can take 20 s)
    s = job_settings
    limit = 20 if answered == 0 else 45
    _tickets(s, 100, seed=7)
    ledger = _ledger(s)
    with fault_proxy(endpoint.url.removesuffix("/v1"), answer_first=answered) as (silent, counts):
        stalled = s.with_overrides(endpoint_url=silent + "/v1", stall_seconds=limit)
        job = start_job(stalled, _consumer(stalled), tag=f"stall{answered}")
        # when it runs, then it stops by itself (not at its deadline) as a stalled run: retry later
        code = job.wait(240)
    assert code == 3, job.output()[-3000:]
    assert counts["unanswered"] > 0
    failed = _the_event(s, "Batch Job Failed")
    waited_for = "after the pipeline started" if answered == 0 else "after the last one"
    assert failed["reason"].startswith("stalled: no result ") and waited_for in failed["reason"]
    assert re.search(rf"\(ICEBATCH_STALL_SECONDS={limit}[;)]", failed["reason"]), failed["reason"]
    assert failed["resumable"] is True and failed["retryable"] is True and failed["error_type"] == "JobStalled"
    assert failed["stage"] == "inference"
    # ... having committed every row it had finished, and only those
    committed = len(_committed(ledger))
    assert committed == failed["rows_committed"] == failed["rows_processed"]
    assert (committed > 0) is (answered > 0)
    if answered == 0:  # nothing done: the whole range stays pending for the next trigger
        pending = ledger.plan()
        assert ledger.pending() is None and pending is not None and pending.expected_rows == 100
        return
    # and the next attempt, with an engine that answers, does the rest: every row exactly once
    resumed = start_job(s, _consumer(s), tag=f"after-stall{answered}")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert sorted(_committed(ledger)) == sorted(_source_rows(ledger))
    assert ledger.plan() is None


def test_a_retried_append_resumed_after_a_kill_labels_each_live_row_once(job_settings: Settings) -> None:
    # given 30 tickets, the same 30 appended again as they are (a writer that retried a commit which had landed),
    # then 10 more: whichever rows the first chunk commits, at least 26 of them have a copy elsewhere in the range
    s = job_settings
    _tickets(s, 30, seed=8)
    ledger = _ledger(s)
    source = ledger.source()
    source.append(source.scan().to_arrow())
    _tickets(s, 10, seed=9)
    # when the job is SIGKILLed (its whole tree) once its first chunk is committed, and run again
    job = start_job(s, _consumer(s), failpoint="chunk.between@1", tag="retried-kill")
    assert job.wait_for_failpoint() is not None, job.output()[-3000:]
    job.kill_tree()
    assert 0 < len(_committed(ledger)) < 40
    resumed = start_job(s, _consumer(s), tag="retried-resume")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    # then every live id has one verdict, counted from the files (not by the job's own planner)
    live = Counter(live_rows(ledger.source()).column("ticket_id").to_pylist())
    verdicts = Counter(ledger.results().scan(selected_fields=("source_id",)).to_arrow().column(0).to_pylist())
    assert (len(live), sum(live.values())) == (40, 70)
    assert verdicts == Counter(set(live)), {i: n for i, n in verdicts.items() if n != 1}
    assert ledger.plan() is None


def test_a_signal_during_a_commit_waits_for_it_and_the_drain_has_a_deadline(job_settings: Settings) -> None:
    # given an attempt paused just before its first commit reaches the catalog (a critical section)
    s = job_settings.with_overrides(drain_seconds=3)
    _tickets(s, 30, seed=3)
    job = start_job(s, _consumer(s), failpoint="commit.before@1", tag="deadline")
    assert job.wait_for_failpoint() is not None
    # when SIGTERM arrives and the commit never ends, then the drain budget ends the process
    job.signal(signal.SIGTERM)
    assert job.wait(120) == 130
    assert "not done 3 s after the signal (ICEBATCH_DRAIN_SECONDS)" in job.output()


def test_a_second_signal_exits_at_once(job_settings: Settings) -> None:
    # given an attempt paused inside a commit, with a long drain budget
    s = job_settings.with_overrides(drain_seconds=100)
    _tickets(s, 30, seed=4)
    job = start_job(s, _consumer(s), failpoint="commit.before@1", tag="twice")
    assert job.wait_for_failpoint() is not None
    # when a second signal follows the first (once the first was taken), then it ends the process at once
    job.signal(signal.SIGTERM)
    job.wait_for_output("a second signal exits at once")
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 130
    assert "second signal" in job.output()


def test_two_attempts_of_one_run_at_once_commit_each_row_once(job_settings: Settings) -> None:
    # given a run killed part way through its range
    s = job_settings
    _tickets(s, 80, seed=5)
    ledger = _ledger(s)
    first = start_job(s, _consumer(s), failpoint="chunk.between@2", tag="first")
    assert first.wait_for_failpoint() is not None
    first.kill_tree()
    pending = ledger.pending()
    assert pending is not None and pending.rows_committed == 2 * _cadence(s)
    # when two attempts of it run at the same time (a stale retry beside the next launch)
    attempts: list[JobProcess] = [start_job(s, _consumer(s), tag=f"race{i}") for i in range(2)]
    codes = sorted(a.wait() for a in attempts)
    # then one completed the run and the other at most lost the race for the last commit ...
    assert codes in ([0, 0], [0, 5]), [a.output()[-2000:] for a in attempts]
    # ... and every row is there exactly once
    assert sorted(_committed(ledger)) == sorted(_source_rows(ledger))
    assert ledger.plan() is None


def test_nothing_the_job_started_outlives_a_sigkill_of_the_job(job_settings: Settings) -> None:
    # given an attempt paused mid-run, with its Ray instance and workers up
    s = job_settings
    _tickets(s, 30, seed=6)
    job = start_job(s, _consumer(s), failpoint="chunk.buffered@1", tag="hygiene")
    assert job.wait_for_failpoint() is not None
    tree = job.tree()
    assert len(tree) > 5  # Ray's processes and workers, and the job's watchdog
    # (Ray 2.60's core gRPC servers listen on every interface whatever the node address: docs/limitations.md)
    assert not [c for p in tree for c in _connections(p) if c.status == psutil.CONN_LISTEN and c.laddr.port == 8265]
    # when only the job's own process is killed without notice (an OOM kill, `kill -9 <pid>`)
    job.proc.send_signal(signal.SIGKILL)
    job.proc.wait(30)
    # then every process it started is gone within seconds, not minutes
    _, alive = psutil.wait_procs([p for p in tree if p.pid != job.proc.pid], timeout=20)
    survivors = [f"{p.pid} {_name(p)}" for p in alive]
    for p in alive:
        p.kill()
    assert survivors == []


def _connections(p: psutil.Process) -> list[Any]:
    try:
        return list(p.net_connections(kind="inet"))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:80]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"


# (killed after the catalog has such a commit: the shared job's lingering round below, the same ledger's resume)
@pytest.mark.parametrize("point", ["commit.before@2"])
def test_a_lingering_job_killed_in_the_range_it_took_loses_and_doubles_nothing(
    job_settings: Settings, point: str
) -> None:
    # given 20 tickets and a consumer whose job lingers (a 600 s window, no cost gate to judge by)
    s = job_settings
    lingering = _consumer(s).model_copy(update={"linger_seconds": 600, "cost_reference": "off"})
    _tickets(s, 20, seed=31)
    ledger = _ledger(s)
    # when the job commits its range, 20 more tickets land while it lingers, and its whole tree is SIGKILLed at
    # the last commit of the range it took (before the catalog has it, or after, before the job has the answer)
    job = start_job(s, lingering, failpoint=point, tag="linger-kill")
    deadline = time.monotonic() + 300
    while not [e for e in _events(s) if e["detail-type"] == "Batch Job Completed"]:
        assert job.proc.poll() is None and time.monotonic() < deadline, job.output()[-3000:]
        time.sleep(0.2)
    _tickets(s, 20, seed=32)
    assert job.wait_for_failpoint() is not None, job.output()[-3000:]
    job.kill_tree()
    # and the next attempt runs (one that does not linger)
    resumed = start_job(s, lingering.model_copy(update={"linger_seconds": 0}), tag="linger-resume")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    # then every ticket has one verdict, counted from the files, and nothing is pending
    _check(ledger, 0)
    live = Counter(live_rows(ledger.source()).column("ticket_id").to_pylist())
    verdicts = Counter(ledger.results().scan(selected_fields=("source_id",)).to_arrow().column(0).to_pylist())
    assert len(live) == 40 and verdicts == Counter(set(live)), {i: n for i, n in verdicts.items() if n != 1}
    assert ledger.plan() is None


# (killed after the catalog has such a commit: the shared job's lingering round below)
@pytest.mark.parametrize("point", ["commit.before@3"])
def test_a_shared_job_killed_mid_run_loses_and_doubles_nothing_for_any_of_its_consumers(
    job_settings: Settings, point: str
) -> None:
    # given 80 tickets and two consumers whose runs one job takes through the same endpoint (a commit every 36 rows)
    s = job_settings.with_overrides(
        consumers_file=consumers_file(
            job_settings.home / "shared",
            {"name": "triage", "backlog_threshold": 1},
            {"name": "privacy", "task": "privacy", "backlog_threshold": 1},
        )
    )
    triage, privacy = (consumer_named(load_consumers(s), name) for name in ("triage", "privacy"))
    _tickets(s, 80, seed=41)
    # when the shared job's whole tree is SIGKILLed at its third commit (one run's chunk, the other's mid-stream)
    job = start_job(s, triage, shared_with=[privacy], failpoint=point, tag="shared-kill")
    assert job.wait_for_failpoint() is not None, job.output()[-3000:]
    job.kill_tree()
    # and a shared job runs again
    resumed = start_job(s, triage, shared_with=[privacy], tag="shared-resume")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    # then each consumer has one verdict per ticket, counted from its files, and nothing is pending
    _one_verdict_per_ticket(s, [triage, privacy], tickets=80)


def _one_verdict_per_ticket(s: Settings, consumers: list[Consumer], *, tickets: int) -> None:
    for consumer in consumers:
        ledger = open_ledger(s, consumer)
        _check(ledger, 0)
        live = Counter(live_rows(ledger.source()).column("ticket_id").to_pylist())
        verdicts = Counter(ledger.results().scan(selected_fields=("source_id",)).to_arrow().column(0).to_pylist())
        assert len(live) == tickets and verdicts == Counter(set(live)), (consumer.name, verdicts)
        assert ledger.plan() is None


# (killed before the catalog has such a commit: the shared job mid-run above, and the lingering job alone)
@pytest.mark.parametrize("point", ["commit.after@4"])
def test_a_shared_job_killed_in_a_round_it_took_while_lingering_loses_and_doubles_nothing(
    job_settings: Settings, point: str
) -> None:
    # given 20 tickets and two consumers whose runs one job takes, lingering for both (a 600 s window, no cost gate)
    lingering = {"linger_seconds": 600, "cost_reference": "off", "backlog_threshold": 1}
    s = job_settings.with_overrides(
        consumers_file=consumers_file(
            job_settings.home / "shared-linger",
            {"name": "triage", **lingering},
            {"name": "privacy", "task": "privacy", **lingering},
        )
    )
    triage, privacy = (consumer_named(load_consumers(s), name) for name in ("triage", "privacy"))
    _tickets(s, 20, seed=51)
    # when both consumers' ranges are committed (a commit each), 20 more tickets land while the job lingers, and its
    # whole tree is SIGKILLed at the round's second commit, after the catalog has it, before the job has the answer
    job = start_job(s, triage, shared_with=[privacy], failpoint=point, tag="shared-linger-kill")
    deadline = time.monotonic() + 300
    while len([e for e in _events(s) if e["detail-type"] == "Batch Job Completed"]) < 2:
        assert job.proc.poll() is None and time.monotonic() < deadline, job.output()[-3000:]
        time.sleep(0.2)
    _tickets(s, 20, seed=52)
    assert job.wait_for_failpoint() is not None, job.output()[-3000:]
    job.kill_tree()
    # and a shared job runs again (one that does not linger)
    quiet = [c.model_copy(update={"linger_seconds": 0}) for c in (triage, privacy)]
    resumed = start_job(s, quiet[0], shared_with=[quiet[1]], tag="shared-linger-resume")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    # then each consumer has one verdict per ticket, counted from its files, and nothing is pending
    _one_verdict_per_ticket(s, [triage, privacy], tickets=40)
