"""The job's process ends when its work does.

A reader of the job's output (a pipe, a RayJob's pod, the GPU node under it) waits for the process and its
streams to end. These tests drive the job's entry point pieces as the process uses them: the end of the
process (``icebatch_job.runtime.end_process``) and its watchdog (``icebatch_job.reaper``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.functional
ROOT = Path(__file__).resolve().parents[2]
CODE = f"{ROOT / 'functions'}:{ROOT / 'jobimage'}"  # this clone's code, in every process a test starts

ENDING = """
import atexit, sys, threading, time
from icebatch_job.runtime import end_process

class TornDown:
    def __del__(self):
        print("torn down", flush=True)  # only the interpreter's teardown of its modules runs this

kept = TornDown()
atexit.register(lambda: print("exit handler ran"))
threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished"))).start()
sys.stdout.write("summary, still buffered\\n")
end_process(7)
"""


def _python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": CODE},
    )  # fmt: skip


def test_the_job_process_ends_as_an_exit_does_but_without_tearing_its_objects_down() -> None:
    # given a process with buffered output, an exit handler, a thread still working and an object that its
    # modules' teardown would finalize; when it ends through end_process
    out, err = _python(ENDING).communicate(timeout=120)
    # then it ends with the status given, its output flushed, after its thread and its exit handlers
    assert "summary, still buffered" in out, err
    assert out.index("thread finished") < out.index("exit handler ran"), out
    # and without the interpreter's teardown of its objects (seconds for the job's heap of modules)
    assert "torn down" not in out, out


def test_the_job_process_ends_with_the_status_it_was_given() -> None:
    # given the same process; when it ends through end_process(7)
    proc = _python(ENDING)
    proc.communicate(timeout=120)
    # then its exit status is 7, as sys.exit(7) would give
    assert proc.returncode == 7


WATCHED = """
import os, subprocess, sys, time
from icebatch_job.reaper import start_reaper

child = subprocess.Popen(["sleep", "300"])
watchdog = start_reaper(poll_seconds=3600)  # it looks for the job's descendants now, then not for an hour
time.sleep(2)  # its first look
print(watchdog, child.pid, flush=True)
sys.stdin.readline()
"""


def _watched() -> tuple[subprocess.Popen[str], psutil.Process, psutil.Process]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": CODE},
    )  # fmt: skip
    assert proc.stdout is not None
    watchdog, child = (psutil.Process(int(pid)) for pid in proc.stdout.readline().split())
    return proc, watchdog, child


def test_the_watchdog_holds_none_of_the_jobs_standard_streams() -> None:
    # given a job with its watchdog
    proc, watchdog, _child = _watched()
    try:
        # then the watchdog's standard streams are not the job's: a reader of the job's output sees its end
        # when the job ends, not when the watchdog does
        assert [os.readlink(f"/proc/{watchdog.pid}/fd/{fd}") for fd in (0, 1, 2)] == [os.devnull] * 3
    finally:
        proc.kill()
        proc.wait(30)


def test_the_watchdog_kills_what_is_left_when_the_job_ends_not_at_its_next_look() -> None:
    # given a job whose watchdog has seen its child and looks again only in an hour
    proc, watchdog, child = _watched()
    assert proc.stdin is not None and proc.stdout is not None
    # when the job ends (its child still running)
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(30) == 0
    # then the job's output ends with it, and its watchdog, told at once, kills the child and exits
    assert proc.stdout.read() == ""
    _, alive = psutil.wait_procs([child, watchdog], timeout=30)
    for p in alive:
        p.kill()
    assert alive == []
