"""The job's process ends when its work does.

A reader of the job's output (a pipe, a RayJob's pod, the GPU node under it) waits for the process and its
streams to end, and nothing the job started may outlive it. These tests drive the job's entry point pieces
as the process uses them: the end of the process (``icebatch_job.process.runtime.end_process``), the
kernel's guarantees it asks for (``icebatch_job.local.lineage``) and its watchdog
(``icebatch_job.local.reaper``). The real job ended every way, with its engine, is tests/hygiene.
"""

from __future__ import annotations

import os
import signal
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
from icebatch_job.process.runtime import end_process

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
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": CODE},
    )


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
from icebatch_job.local.reaper import start_reaper

child = subprocess.Popen(["sleep", "300"], start_new_session=True)  # in a group of its own, as vLLM's are
watchdog = start_reaper(poll_seconds=3600)  # it looks for the job's descendants now, then not for an hour
time.sleep(2)  # its first look
if "--late" in sys.argv:  # a child started since that look (as Ray starts its workers): the watchdog has not seen it
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
print(watchdog, child.pid, flush=True)
sys.stdin.readline()
"""


def _watched(*args: str) -> tuple[subprocess.Popen[str], psutil.Process, psutil.Process]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHED, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": CODE},
        start_new_session=True,
    )
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


@pytest.mark.parametrize("late", [False, True], ids=["a child it has seen", "a child started since its last look"])
def test_the_watchdog_outlives_a_kill_of_the_jobs_whole_process_group(late: bool) -> None:
    # given a job (in a process group of its own) whose watchdog looked for its descendants once, and a child of
    # the job in another group, started before that look or after it (as Ray starts its workers)
    proc, watchdog, child = _watched(*(["--late"] if late else []))
    assert os.getsid(watchdog.pid) not in (os.getsid(proc.pid), os.getsid(0))  # a session of its own
    # when the job's whole process group is killed without notice (a CI timeout, a supervisor, `kill -9 -PGID`)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    # then the watchdog, not in that group, kills the child the job left (one it has not seen: found by the job's
    # mark in its environment), and exits
    _, alive = psutil.wait_procs([child, watchdog], timeout=30)
    for p in alive:
        p.kill()
    assert alive == []


SUBREAPER = """
import os, subprocess, sys, time
from icebatch_job.local.lineage import adopt_orphans, end_descendants
assert adopt_orphans()
# a child that starts a grandchild in a session of its own, then exits: the grandchild is an orphan
middle = subprocess.Popen([sys.executable, "-c",
    "import subprocess; p = subprocess.Popen(['sleep', '300'], start_new_session=True); print(p.pid)"],
    stdout=subprocess.PIPE, text=True)
orphan = int(middle.stdout.readline())
middle.wait()
time.sleep(0.5)
parent = int(open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[1])
print(orphan, parent, os.getpid(), flush=True)
print(" ".join(end_descendants()), flush=True)
print(os.path.exists(f"/proc/{orphan}"), flush=True)
"""


def test_the_jobs_orphans_are_handed_to_it_and_ended_with_it() -> None:
    # given a job process that adopts its tree's orphans, and a grandchild whose parent has exited
    out, err = _python(SUBREAPER).communicate(timeout=60)
    lines = out.splitlines()
    orphan, parent, job = (int(v) for v in lines[0].split())
    # then the orphan was handed to the job, not to PID 1 ...
    assert parent == job, (lines, err)
    # ... and at the job's end it is killed and reaped: no process, not even a zombie, is left of it
    assert lines[1] == f"{orphan} sleep", (lines, err)
    assert lines[2] == "False", (lines, err)


def test_settings_still_read_from_the_environment_of_a_job_with_a_watchdog() -> None:
    # given a process whose watchdog marked its environment (every process it starts inherits the mark)
    code = (
        "from icebatch_job.local.reaper import start_reaper, TREE_VARIABLE\n"
        "import os\n"
        "start_reaper()\n"
        "assert TREE_VARIABLE in os.environ\n"
        "from icebatch.core.settings import Settings\n"
        "print(Settings.from_env().engine.batch_size)\n"
    )
    out, err = _python(code).communicate(timeout=60)
    # then its settings (and those of each process it starts) read as before: the mark is not an unknown setting
    assert out.strip().isdigit(), err
