"""Nothing the job starts outlives it, however it ends (make test-hygiene).

Each case starts the real job (Ray, the real vLLM engine on CPU: its engine core and model worker) as its
own process tree, with a marker in its environment that every descendant inherits (Ray's
workers and agents, the engine's processes, whatever their process group). It ends the job one way, at one
point of its life, and then looks through every process on the machine for the marker: none may be alive
10 s after the job's end, and no shared memory the job created may be left in /dev/shm (vLLM's queues).
``HYGIENE_REPEAT=N`` runs each case N times (a race that shows one time in three).

Five jobs, three minutes each on two cores, so each case is a path of its own: a running job ended by the
signal it handles (SIGTERM; SIGINT has the same handler: tests/unit/test_interrupts.py), by a kill of its
process alone (Ray's head processes follow by the kernel's parent-death signal) or of its whole group (only the
watchdog is left to act: its terminal closing, SIGHUP to the group, which the job does not handle, ends it the
same way, and what survives a SIGHUP is left to the same watchdog); a job whose engine is starting stopped, or
killed with its group as the CLI that runs it in-process. A job that finishes leaves nothing either:
tests/e2e/test_demo.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from icebatch.core.catalog import open_catalog
from icebatch.core.consumers import Consumer, consumer_named, load_consumers
from icebatch.core.errors import EXIT_INTERRUPTED
from icebatch.core.settings import Settings
from icebatch_job.example.tickets import append_tickets, ensure_source_table, generate_tickets

from tests.support.consumers import consumers_file
from tests.support.cpu import pytest_runtest_makereport  # noqa: F401 (a red test here names its CPU)
from tests.support.job_process import JobProcess, start_job
from tests.support.leftovers import MARK, marked, shared_memory

pytestmark = [pytest.mark.hygiene]

GRACE_SECONDS = 10
REPEAT = int(os.environ.get("HYGIENE_REPEAT", "1"))


def tree(job: JobProcess, mark: str) -> dict[int, str]:
    """The job's processes now, 'pid name command line' by pid: those that carry its mark and those that descend
    from it (a process whose environment block was overwritten by its title, as setproctitle does for vLLM's, is
    still its parent's child). One pass over every process: a walk from the job would lose its whole answer to a
    process ending mid-walk (Ray runs short-lived commands while it starts)."""
    found = {int(line.split(" ", 1)[0]): line for line in marked(mark)}
    children: dict[int, list[psutil.Process]] = {}
    for p in psutil.process_iter(["ppid"]):
        children.setdefault(p.info["ppid"] or 0, []).append(p)
    todo = [job.proc.pid]
    while todo:
        for p in children.get(todo.pop(), []):
            todo.append(p.pid)
            with contextlib.suppress(psutil.Error):
                found.setdefault(p.pid, f"{p.pid} {p.name()} {' '.join(p.cmdline())[:100]}")
    return found


def _is_phase(job: JobProcess, processes: dict[int, str], phase: str) -> bool:
    """Whether the job's ``phase`` is up: its engine starting (vLLM's engine core started: it starts the model
    worker and their queues in /dev/shm), or its engine answering (the first results counted on its progress
    line: every process of its tree is up)."""
    if phase == "engine starting":
        return _engine_core_up(processes)
    return re.search(r"\[icebatch\] [1-9][\d,]*/", job.output()) is not None


def _wait_for(job: JobProcess, mark: str, phase: str, timeout: float = 600) -> dict[int, float]:
    """Until the job's ``phase`` is up; then its processes (pid -> start time), to look for after its end."""
    deadline = time.monotonic() + timeout
    names: set[str] = set()  # every process name seen, for the failure message
    elsewhere = ""  # the last vLLM processes seen on the machine but not in the job's tree, for the same
    while time.monotonic() < deadline:
        now = tree(job, mark)
        if _is_phase(job, now, phase):
            return _started(now)
        names |= {line.split(" ")[1] for line in now.values()}
        elsewhere = _vllm_processes() or elsewhere
        if job.proc.poll() is not None:
            raise AssertionError(
                f"the job ended before its {phase} was up (seen: {sorted(names)}; vLLM's processes elsewhere: "
                f"{elsewhere or 'none'}): {job.output()[-3000:]}"
            )
        time.sleep(0.1)
    raise AssertionError(f"no {phase} in {timeout} s (seen: {sorted(names)}): {job.output()[-3000:]}")


def _engine_core_up(processes: dict[int, str]) -> bool:
    """Whether vLLM's engine core runs in the job's tree: a process with its title, or one multiprocessing spawned
    from the engine stage's actor (the title is setproctitle's, which vLLM skips silently where it fails: CI saw an
    engine core, and its worker, still called 'python' with the engine answering)."""
    if any("VLLM::EngineCor" in line for line in processes.values()):
        return True
    actors = {pid for pid, line in processes.items() if "vLLMEngineStageUDF" in line}
    for pid in processes:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.ppid() in actors and "--multiprocessing-fork" in p.cmdline():
                return True
    return False


def _vllm_processes() -> str:
    """Every vLLM process on the machine with its chain of parents (where an engine hangs from, when a job's
    tree is missing it); "" if none."""
    chains = []
    for p in psutil.process_iter(["name"]):
        if (p.info["name"] or "").startswith("VLLM::"):
            with contextlib.suppress(psutil.Error):
                chains.append(" <- ".join(f"{q.pid} {q.name()}" for q in [p, *p.parents()]))
    return "; ".join(chains)


def _described(processes: dict[int, str]) -> str:
    return f"the job's processes: {sorted(processes.values())}; vLLM's: {_vllm_processes() or 'none'}"


def _started(processes: dict[int, str]) -> dict[int, float]:
    out = {}
    for pid in processes:
        with contextlib.suppress(psutil.Error):
            out[pid] = psutil.Process(pid).create_time()
    return out


def _still_running(seen: dict[int, float]) -> list[str]:
    """Those of ``seen`` still running as the same process (its start time), zombies aside."""
    left = []
    for pid, started in seen.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {p.name()}")
    return left


def _left_after_grace(mark: str, shm_before: set[str], seen: dict[int, float] | None = None) -> list[str]:
    """The job's processes (marked, or ``seen`` while it ran) still alive ``GRACE_SECONDS`` after its end, and
    the shared memory it left."""
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        left = sorted({*marked(mark), *_still_running(seen or {})})
        left += sorted(f"/dev/shm/{name}" for name in shared_memory() - shm_before)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.25)


@pytest.fixture
def job_settings(tmp_path: Path, tiny_model: Path) -> Settings:
    """The embedded default (the engine in the job's process tree) over 600 tickets, of which at most 240 are let
    into the pipeline before a commit (``commit.window``): a job held before its first commit keeps its engine up,
    waiting for rows (were all 600 in, the engine could finish them, and Ray end its processes, before a signal)."""
    home = tmp_path / "home"
    s = Settings(
        home=home,
        model_source=str(tiny_model),
        batch_size=16,
        max_num_seqs=32,  # 112 rows in flight (``pipeline.in_flight_rows``): a chunk of 240 holds twice that
        chunk_rows=240,
        consumers_file=consumers_file(home / "consumers", {"name": "triage", "backlog_threshold": 1}),
    )
    table = ensure_source_table(open_catalog(s), s.catalog.source_table)
    append_tickets(table, generate_tickets(600, random.Random(7)))
    return s


def _consumer(s: Settings) -> Consumer:
    return consumer_named(load_consumers(s), "triage")


@pytest.fixture
def marks() -> Iterator[list[str]]:
    """The marks of the jobs a test starts; whatever still carries one when the test ends is killed."""
    started: list[str] = []
    yield started
    for mark in started:
        for line in marked(mark):
            try:
                os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _start(
    s: Settings, marks: list[str], *, launch: bool = False, failpoint: str | None = None
) -> tuple[JobProcess, str, set[str]]:
    """The job started with a new mark; the shared memory there was before it."""
    marks.append(uuid.uuid4().hex)
    shm_before = shared_memory()
    job = start_job(s, _consumer(s), launch=launch, failpoint=failpoint, extra_env={MARK: marks[-1]}, tag="hygiene")
    return job, marks[-1], shm_before


ENDINGS = {  # what ends the job: (signal, to its whole process group?)
    "SIGTERM": (signal.SIGTERM, False),  # a pod's deletion, a RayJob's deadline, `kill`; Ctrl-C's SIGINT alike
    "SIGKILL": (signal.SIGKILL, False),  # an OOM kill, `kill -9 <pid>`
    "SIGKILL to the group": (signal.SIGKILL, True),  # a CI timeout, a supervisor, `kill -9 -<pgid>`
}
EXPECTED_STATUS = {"SIGTERM": EXIT_INTERRUPTED}


@pytest.mark.parametrize("repeat", range(REPEAT), ids=lambda i: f"run{i + 1}")
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_nothing_outlives_a_job_ended_while_its_engine_runs(
    job_settings: Settings, marks: list[str], ending: str, repeat: int
) -> None:
    # given the job with its engine answering: its first results in (every process of its tree is up), the job
    # held there by the failpoint chunk.buffered, so that it cannot finish before the signal lands
    job, mark, shm = _start(job_settings, marks, failpoint="chunk.buffered@1")
    assert job.wait_for_failpoint(timeout=600) is not None, job.output()[-3000:]
    now = tree(job, mark)
    seen = _started(now)
    assert any("raylet" in line for line in now.values()), _described(now)
    assert _engine_core_up(now), _described(now)
    # when it is ended this way
    signum, group = ENDINGS[ending]
    if group:
        os.killpg(job.proc.pid, signum)
    else:
        job.proc.send_signal(signum)
    status = job.proc.wait(300)
    # then it ended as that ending says (a signal it handles: the finished rows committed, exit 130) ...
    assert status == EXPECTED_STATUS.get(ending, -signum), job.output()[-3000:]
    # ... and nothing it started is alive 10 s later
    assert _left_after_grace(mark, shm, seen) == [], f"left by {ending} of {len(seen)} processes"


@pytest.mark.parametrize("repeat", range(REPEAT), ids=lambda i: f"run{i + 1}")
def test_nothing_outlives_the_cli_that_ran_the_job_in_its_own_process(
    job_settings: Settings, marks: list[str], repeat: int
) -> None:
    # given `icebatch launch --force` (the embedded default: the job runs in the CLI's process, as in the demo),
    # killed with its group while its engine is starting
    job, mark, shm = _start(job_settings, marks, launch=True)
    seen = _wait_for(job, mark, "engine starting")
    os.killpg(job.proc.pid, signal.SIGKILL)
    assert job.proc.wait(300) == -signal.SIGKILL
    # then nothing it started is alive 10 s later
    assert _left_after_grace(mark, shm, seen) == [], f"left of {len(seen)} processes"


@pytest.mark.parametrize("repeat", range(REPEAT), ids=lambda i: f"run{i + 1}")
def test_nothing_outlives_a_job_stopped_while_its_engine_starts(
    job_settings: Settings, marks: list[str], repeat: int
) -> None:
    # given the job whose engine is starting: vLLM's model worker up, its queues with the engine core created
    job, mark, shm = _start(job_settings, marks)
    seen = _wait_for(job, mark, "engine starting")
    # when it is stopped (SIGTERM: it stops the run and shuts Ray down mid-start)
    job.proc.send_signal(signal.SIGTERM)
    status = job.proc.wait(300)
    # then it exits as interrupted, and neither a process nor a queue's segment in /dev/shm is left
    assert status == EXIT_INTERRUPTED, job.output()[-3000:]
    assert _left_after_grace(mark, shm, seen) == [], f"left of {len(seen)} processes"
