"""The engine's processes come from a fork server that imported what they need once
(icebatch_job.process.engine_processes).

The fork server is a process-wide singleton of ``multiprocessing``, so each check runs in a child interpreter
of its own, started the way a Ray actor would start vLLM's processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from icebatch_job.process.engine_processes import omp_binding, process_start_on, uses_fork_server

ROOT = Path(__file__).resolve().parents[2]

# A fork server that preloads ``marker`` (which records each import of it; the server finds it on PYTHONPATH, as
# the job's finds icebatch_job), then two processes from it, after an environment change made once it ran.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys

    from icebatch_job.process.engine_processes import EngineServerContext, start_fork_server


    def report(queue):
        import setproctitle

        setproctitle.setproctitle("icebatch-test")  # as vLLM names its processes
        queue.put({
            "title": open("/proc/self/comm").read().strip(),
            "ppid": os.getppid(),
            "late": os.environ.get("ICEBATCH_TEST_LATE"),
            "early": os.environ.get("ICEBATCH_TEST_EARLY"),
            "marker_loaded": "marker" in sys.modules,
        })


    if __name__ == "__main__":
        os.environ["ICEBATCH_TEST_EARLY"] = "in the server's environment only"
        start_fork_server("marker")
        del os.environ["ICEBATCH_TEST_EARLY"]
        os.environ["ICEBATCH_TEST_LATE"] = "set after the server started"
        ctx = EngineServerContext()
        seen = []
        for _ in range(2):
            queue = ctx.Queue()
            process = ctx.Process(target=report, args=(queue,))
            process.start()
            seen.append(queue.get(timeout=60))
            process.join(60)
            seen[-1]["exitcode"] = process.exitcode
        print(json.dumps({"me": os.getpid(), "children": seen}))
    """
)


@pytest.mark.parametrize(
    ("process_start", "engine_kwargs", "expected"),
    [
        ("forkserver", {}, True),
        ("forkserver", {"distributed_executor_backend": "uni"}, True),
        ("forkserver", {"distributed_executor_backend": "mp"}, True),
        # vLLM's Ray executor (tensor or pipeline parallelism): its processes use Ray, which a fork breaks
        ("forkserver", {"distributed_executor_backend": "ray"}, False),
        ("spawn", {"distributed_executor_backend": "uni"}, False),
    ],
)
def test_the_fork_server_serves_engines_that_do_not_run_on_ray(
    process_start: str, engine_kwargs: dict, expected: bool
) -> None:
    # given the setting and the executor Ray Data LLM chose; then
    assert uses_fork_server(engine_kwargs, process_start) is expected


def test_processes_from_the_fork_server_share_its_imports_and_get_their_parents_environment(tmp_path: Path) -> None:
    # given a module that records every import of it, preloaded by the fork server
    imports = tmp_path / "imports.txt"
    (tmp_path / "marker.py").write_text(f"import os\nopen({str(imports)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    path = [str(tmp_path), str(ROOT / "functions"), str(ROOT / "jobimage")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    # when a process starts two processes from its fork server, changing its environment after the server started
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # then the module was imported once, by the server, and both processes have it without importing it again
    importers = imports.read_text().split()
    assert len(importers) == 1, importers
    server = int(importers[0])
    assert server != out["me"]
    for child in out["children"]:
        assert child["exitcode"] == 0
        assert child["ppid"] == server  # forked by the server, not by the process that asked
        assert child["marker_loaded"] is True
        # and each runs with its parent's environment at its start, as a spawned process would
        assert child["late"] == "set after the server started"
        assert child["early"] is None
        # and can name itself, as vLLM's processes do
        assert child["title"] == "icebatch-test"


@pytest.mark.parametrize(
    ("environ", "cpus", "threads"),
    [
        # what vLLM's OMPProcessManager sets around a model worker's start, with each OpenMP runtime
        ({"OMP_PLACES": "{0,2,3}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "3"}, {0, 2, 3}, 3),
        ({"GOMP_CPU_AFFINITY": "4 5", "OMP_NUM_THREADS": "2"}, {4, 5}, 2),
        ({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[1,7]", "OMP_NUM_THREADS": "2"}, {1, 7}, 2),
        # a user's own OpenMP places are the runtime's business; no variables, no binding
        ({"OMP_PLACES": "cores", "OMP_NUM_THREADS": "1"}, None, 1),
        ({"OMP_NUM_THREADS": "0"}, None, None),
        ({}, None, None),
    ],
)
def test_the_binding_is_read_as_vllm_writes_it(environ: dict, cpus: set[int] | None, threads: int | None) -> None:
    assert omp_binding(environ) == (cpus, threads)


BOUND_SCRIPT = textwrap.dedent(
    """
    import json, os, sys

    import torch  # loaded, with its OpenMP runtime, before the fork: as in vLLM's engine core

    from icebatch_job.process.engine_processes import BoundForkContext


    def report(queue):
        queue.put({"cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()})


    def start(ctx):
        queue = ctx.Queue()
        process = ctx.Process(target=report, args=(queue,))
        process.start()
        seen = queue.get(timeout=60)
        process.join(60)
        return {"exitcode": process.exitcode, **seen}


    if __name__ == "__main__":
        torch.set_num_threads(2)
        cpu = max(os.sched_getaffinity(0))
        os.environ.update({"OMP_PLACES": "{%d}" % cpu, "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "1"})
        ctx = BoundForkContext()
        bound = start(ctx)
        allowed = sorted(os.sched_getaffinity(0))
        os.environ["OMP_PLACES"] = "{%d,100000}" % cpu  # a place this machine does not have, beside one it has
        partly = start(ctx)
        os.environ["OMP_PLACES"] = "{100000}"
        nowhere = start(ctx)
        print(json.dumps({"cpu": cpu, "allowed": allowed, "start_method": ctx.get_start_method(), **bound,
                          "partly": partly, "nowhere": nowhere}))
    """
)


def test_a_forked_model_worker_is_bound_as_vllm_binds_a_spawned_one(tmp_path: Path) -> None:
    # given a process with torch loaded (two threads) that sets vLLM's binding variables for one CPU, one thread
    script = tmp_path / "bound.py"
    script.write_text(BOUND_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT / "jobimage")])}
    # when it forks a process the way the engine core forks its model worker
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # then the process runs on that CPU with that many threads, as a spawned one reading them would
    assert (out["exitcode"], out["start_method"]) == (0, "fork")  # vLLM checks the method by name
    assert (out["cpus"], out["threads"]) == ([out["cpu"]], 1)
    # and places the machine does not have are left out, as OpenMP leaves them: never a failed start
    assert (out["partly"]["exitcode"], out["partly"]["cpus"]) == (0, [out["cpu"]])
    assert (out["nowhere"]["exitcode"], out["nowhere"]["cpus"]) == (0, out["allowed"])


@pytest.mark.parametrize(
    ("device", "setting", "expected"),
    [
        ("cpu", "auto", "forkserver"),
        ("gpu", "auto", "spawn"),
        ("gpu", "forkserver", "forkserver"),
        ("cpu", "spawn", "spawn"),
    ],
)
def test_the_fork_server_is_the_default_only_where_it_was_measured(device: str, setting: str, expected: str) -> None:
    # given ICEBATCH_ENGINE_PROCESS_START and the engine's device; then auto forks on CPU and spawns on a GPU
    assert process_start_on(device, setting) == expected
