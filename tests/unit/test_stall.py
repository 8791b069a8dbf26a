"""A job that waits too long for a result stops itself: the watch, and the stop it asks for."""

from __future__ import annotations

import threading
import time

import pytest
from icebatch_job.process.interrupts import Interrupts, JobStalled
from icebatch_job.process.stall import StallWatch, stall_reason


@pytest.mark.parametrize(
    ("waited", "limit", "results", "expected"),
    [
        (29.9, 30, 0, None),
        (30, 30, 0, "stalled: no result 30 s after the pipeline started (ICEBATCH_STALL_SECONDS=30)"),
        (45, 30, 1_200, "stalled: no result for 45 s after the last one (ICEBATCH_STALL_SECONDS=30; 1,200 rows"),
        (10**6, 0, 5, None),  # 0: no limit
    ],
)
def test_the_reason_names_the_wait_and_the_setting(waited: float, limit: float, results: int, expected: str) -> None:
    reason = stall_reason(waited, limit, results)
    assert reason == expected if expected is None else reason is not None and reason.startswith(expected)


def _watch(limit: float) -> tuple[StallWatch, list[str], threading.Event]:
    calls: list[str] = []
    called = threading.Event()

    def on_stall(reason: str) -> None:
        calls.append(reason)
        called.set()

    return StallWatch(limit, on_stall, poll_seconds=0.02), calls, called


def test_a_pipeline_with_no_result_is_stopped_once() -> None:
    # given a watch with a limit of 0.1 s
    watch, calls, called = _watch(0.1)
    # when no result arrives
    with watch:
        assert called.wait(10)
        time.sleep(0.2)
    # then it asks once for the run to stop, for want of a first result
    assert len(calls) == 1 and calls[0].startswith("stalled: no result 0 s after the pipeline started")


def test_the_drivers_own_work_is_not_a_stall_but_a_wait_after_it_is() -> None:
    # given a watch with a limit of 0.1 s, and a result that arrived
    watch, calls, called = _watch(0.1)
    with watch:
        watch.arrived(64)
        # when the driver works on it (parses, commits) for longer than the limit, then nothing happens
        time.sleep(0.3)
        assert calls == []
        # when it then waits for the next result for longer than the limit, then the run is stopped
        watch.waiting()
        assert called.wait(10)
    assert calls[0].startswith("stalled: no result for 0 s after the last one") and "64 rows" in calls[0]


def test_no_limit_never_stops_a_run() -> None:
    watch, calls, _ = _watch(0)
    with watch:
        time.sleep(0.2)
    assert calls == []


def test_a_stop_from_another_thread_wakes_the_waiting_main_thread_with_its_reason() -> None:
    # given the job's signal handling installed, and a main thread waiting (as on the pipeline's next result)
    interrupts = Interrupts(drain_seconds=60)
    interrupts.install()
    try:
        threading.Timer(0.1, interrupts.stop, args=("stalled: test",)).start()
        # when another thread stops the run, then the wait ends with the stall, which carries the reason
        with pytest.raises(JobStalled, match="stalled: test"):
            threading.Event().wait(30)
        assert interrupts.requested
    finally:
        interrupts.uninstall()
