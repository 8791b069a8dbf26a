"""A drained job's idle window (``icebatch_job.linger``) on a real SQL catalog, with a fake clock: whether it keeps its
node, what it waits for, and what the window is billed as."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from icebatch.core.bus import load_publisher
from icebatch.core.catalog import open_catalog
from icebatch.core.costs.estimate import pace, run_cost
from icebatch.core.ledger import Key, ResultsLedger, RunRecord, RunTotals, open_ledger
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets
from icebatch_job.job import JobRequest, JobRun, linger
from icebatch_job.linger import Linger, decide, decide_group, landed_rows, wait_for_rows

from tests.support.consumers import consumer, consumers_file

pytestmark = pytest.mark.functional


def _ledger(settings: Settings, **entry: object) -> ResultsLedger:
    path = consumers_file(settings.home / "consumers", {"name": "triage", **entry})
    s = settings.with_overrides(consumers_file=path)
    ensure_source_table(open_catalog(s), s.catalog.source_table)
    return open_ledger(s, consumer(s))


def _append(ledger: ResultsLedger, n: int, seed: int) -> None:
    append_tickets(ledger.source(), generate_tickets(n, random.Random(seed)))


class FakeClock:
    """Seconds that pass only when the code under test sleeps; ``at`` runs an action when a time is reached."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.actions: list[tuple[float, object]] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        for when, action in list(self.actions):
            if self.now >= when:
                self.actions.remove((when, action))
                action()  # type: ignore[operator]


def test_a_job_waits_for_the_next_commit_and_no_longer_than_its_window(settings: Settings) -> None:
    # given a consumer's ledger with nothing new, and a commit that lands 35 s into a 60 s window
    ledger = _ledger(settings, linger_seconds=60, cost_reference="off")
    clock = FakeClock()
    clock.actions.append((35.0, lambda: _append(ledger, 7, seed=1)))
    window = Linger(60.0, True, "test")

    # when the job waits
    found = wait_for_rows([ledger], window, clock=clock, sleep=clock.sleep)

    # then it takes the commit at the first poll after it landed, polling the metadata every 3 s
    assert found and 35.0 <= clock.now < 35.0 + window.poll_seconds
    assert set(clock.slept) == {3.0}

    # and given nothing more, it waits the window out, to the second, and ends
    quiet = _ledger(settings.with_overrides(home=settings.home / "quiet"), linger_seconds=60, cost_reference="off")
    clock = FakeClock()
    assert not wait_for_rows([quiet], window, clock=clock, sleep=clock.sleep)
    assert clock.now == 60.0


def test_the_node_is_kept_only_while_the_rows_that_land_would_pay_for_it(settings: Settings) -> None:
    # given a consumer on EKS with a cost gate (the batch price), 5 rows landed just now
    settings = settings.with_overrides(backend="kuberay")
    ledger = _ledger(settings)
    _append(ledger, 5, seed=2)

    # when its drained job decides: 5 rows in a window do not pay for a cold start's worth of idle GPU
    trickle = decide(ledger, ledger.consumer, settings)
    assert not trickle.keeps and "too few to pay" in trickle.why
    # the window: no runs yet, the start-up prior, and the cluster's idle tail
    tail = settings.cluster.job_ttl_seconds + settings.cluster.karpenter_consolidate_seconds
    assert trickle.seconds == settings.launch.startup_seconds_prior + tail

    # and 50,000 rows within the window do
    _append(ledger, 50_000, seed=3)
    burst = decide(ledger, ledger.consumer, settings)
    assert burst.keeps and "enough to pay" in burst.why

    # and rows older than the window count for nothing
    later = int(time.time() * 1000) + int(burst.seconds * 1000) + 1000
    assert landed_rows(ledger, since_ms=later - int(burst.seconds * 1000)) == 0
    assert not decide(ledger, ledger.consumer, settings, now_ms=later).keeps


def test_a_shared_job_keeps_its_node_for_the_rows_that_land_for_all_its_consumers(settings: Settings) -> None:
    from icebatch.core.consumers import load_consumers
    from icebatch.core.costs.lease import Member, group_check

    # given triage and privacy on EKS, consumers of one table and one model, each gated by the batch price
    path = consumers_file(settings.home / "consumers", {"name": "triage"}, {"name": "privacy", "task": "privacy"})
    s = settings.with_overrides(backend="kuberay", consumers_file=path)
    ensure_source_table(open_catalog(s), s.catalog.source_table)
    triage, privacy = load_consumers(s)
    members = [(open_ledger(s, triage), triage), (open_ledger(s, privacy), privacy)]
    # and as many rows landed just now as pay for a cold start when both consumers' work is priced as one job
    rows = 1
    while not (check := group_check([Member(triage, rows), Member(privacy, rows)], s)).pays:  # type: ignore[union-attr]
        assert check is not None and check.rows_to_pay is not None
        rows = max(rows + 1, -(-check.rows_to_pay // 2))
    _append(members[0][0], rows, seed=7)
    # when the shared job has drained its ranges and decides, for both consumers at once
    window = decide_group(members, s)
    # then it keeps its node (the rows of both pay), where a job of either consumer alone would not
    assert window.keeps and "for triage, privacy: enough to pay" in window.why, window.why
    assert not decide(members[0][0], triage, s).keeps and not decide(members[1][0], privacy, s).keeps
    # and its window is the longest of theirs
    assert window.seconds == max(decide(ledger, c, s).seconds for ledger, c in members)


def test_a_window_of_zero_never_lingers(settings: Settings) -> None:
    ledger = _ledger(settings, linger_seconds=0, cost_reference="off")
    _append(ledger, 500, seed=4)
    assert decide(ledger, ledger.consumer, settings) == Linger(0.0, False, "linger_seconds is 0")


def test_a_local_job_lingers_only_when_its_consumer_asks(settings: Settings) -> None:
    # given a burst that would pay for a cold start, on the local backend (the job runs in the launching command)
    ledger = _ledger(settings)
    _append(ledger, 50_000, seed=5)
    # then without linger_seconds the job ends with its range (`make demo` does not hang for a window)
    assert not decide(ledger, ledger.consumer, settings).keeps
    asked = _ledger(settings.with_overrides(home=settings.home / "asked"), linger_seconds=30)
    _append(asked, 50_000, seed=5)
    assert decide(asked, asked.consumer, settings).keeps


def _record(run_id: str, totals: RunTotals) -> RunRecord:
    return RunRecord(run_id, 1, 0, None, 1, "ticket-triage", 1, totals.summary())


def test_a_lingering_jobs_runs_add_up_to_its_nodes_lifetime(tmp_path: Path) -> None:
    # given a kuberay deployment (a 60 s RayJob TTL and 30 s of Karpenter consolidation after a job)
    s = Settings(home=tmp_path, backend="kuberay", job_ttl_seconds=60, karpenter_consolidate_seconds=30)
    base = {"rows": 100, "rows_ok": 100, "rows_error": 0, "input_tokens": 1, "output_tokens": 1, "gpus": 1}
    # a job whose cold run took 200 s and kept the node (a 300 s window), then took 40 s of rows 50 s later (warm),
    # then waited its window out: its node lived 200 + 50 + 40 + 300 s, and its tail 90 s
    cold = RunTotals(**base, engine_seconds=150, job_seconds=200, linger_seconds=300)
    warm = RunTotals(**base, engine_seconds=35, job_seconds=90, warm=True)
    read = [_record("cold", cold).totals(s.billing()), _record("warm", warm).totals(s.billing())]

    # when each run is costed as `runs`, `costs` and the reports cost it (from the ledger's record)
    lifetimes = [run_cost(t, s).gpu_lifetime_seconds for t in read]

    # then the cold run pays its time, the cluster's tail and the last window; the warm run its time, wait included
    assert lifetimes == [200 + 90 + 300, 90]
    assert sum(lifetimes) == 200 + 50 + 40 + 300 + 90
    # and a warm run retried in a job of its own pays that job's tail
    retried = RunTotals(**{**base, "engine_seconds": 35, "job_seconds": 130, "warm": True, "attempts": 2})
    assert run_cost(_record("r", retried).totals(s.billing()), s).gpu_lifetime_seconds == 130 + 90


def test_a_warm_run_tells_the_pace_not_the_cold_start(tmp_path: Path) -> None:
    # given a cold run (100 s of start-up and commits) and a warm one (5 s), each streaming 1,000 rows in 100 s
    s = Settings(home=tmp_path)
    common = {"rows": 1000, "rows_ok": 1000, "rows_error": 0, "input_tokens": 1, "output_tokens": 1}
    cold = RunTotals(**common, engine_seconds=100, engine_startup_seconds=0, job_seconds=200)
    warm = RunTotals(**common, engine_seconds=100, engine_startup_seconds=0, job_seconds=105, warm=True)
    runs = [_record("warm", warm), _record("cold", cold)]
    assert runs[0].warm and runs[0].properties[Key.WARM_START] == "1"

    # when the estimate learns from them
    measured = pace(consumer(s), runs, s)

    # then the start-up a launch pays is the cold run's; the rows per GPU-hour are both runs'
    assert measured.fixed_seconds == 100
    assert measured.rows_per_gpu_hour == 2000 / (200 / 3600)


def test_a_source_that_cannot_be_read_while_the_job_lingers_ends_it_not_the_runs_it_made(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job whose run is committed and which keeps its node, and a catalog that fails while it waits
    ledger = _ledger(settings, linger_seconds=60, cost_reference="off")
    s = settings.with_overrides(consumers_file=settings.home / "consumers" / "consumers.yaml")
    first = JobRun(s, ledger.consumer, JobRequest(), load_publisher(s), lambda _text: None, ledger)
    first.linger = Linger(60.0, True, "test")

    def unreachable(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("the catalog is throttling")

    monkeypatch.setattr(ledger, "backlog", unreachable)
    # when it waits, then it stops lingering (a warning) instead of failing the job it already completed
    assert linger(first) == []
