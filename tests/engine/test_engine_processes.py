"""The engine stage's vLLM processes: forked from a warm fork server by default, vLLM's spawn when asked.

Each case builds the job's engine stage (``EngineStageUDF``, the real vLLM on CPU) in a child interpreter of
its own (the fork server is process-wide), answers a prompt twice (decoded the job's way and by vLLM), shuts
the engine down, and reports the processes it had.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pathlib import Path

    import psutil
    from icebatch.core.settings import Settings
    from icebatch_job.stages.engine_outputs import engine_sampling
    from icebatch_job.stages.engine_stage import EngineStageUDF
    from icebatch_job.stages.pipeline import engine_config
    from icebatch_job.process.runtime import prepare_environment
    from vllm.utils.ompmultiprocessing import OMPProcessManager


    async def main(model, process_start, home):
        settings = Settings(home=home, model_source=model)
        prepare_environment(settings, device="cpu")
        # the executor Ray Data LLM chooses for one device per replica
        kwargs = {**engine_config(settings, model, "cpu").engine_kwargs, "distributed_executor_backend": "uni"}
        stage = EngineStageUDF(
            data_column="__data", expected_input_keys=["sampling_params"], batch_size=1, max_concurrent_batches=1,
            model=model, engine_kwargs=kwargs, log_engine_metrics=False, process_start=process_start,
        )
        children = psutil.Process().children(recursive=True)
        tree = [{"pid": p.pid, "ppid": p.ppid(), "name": p.name(), "cpus": p.cpu_affinity()} for p in children]
        # the CPUs vLLM's CPU backend binds its model worker to (a spawned worker gets them from its environment)
        binding = OMPProcessManager(stage.stage.llm._vllm_config).cpu_lists[0]
        # one answer the job's way (decoded once, in the actor), one detokenized by vLLM as tokens arrive
        sampling = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
        rows = [{"prompt": "Hello", "sampling_params": engine_sampling(sampling)},
                {"prompt": "Hello", "sampling_params": {**sampling, "detokenize": True}}]
        outputs = [out async for out in stage({"__data": rows})]
        stage.stage.llm.shutdown()
        engine = [p for p, seen in zip(children, tree) if seen["name"].startswith("VLLM::")]
        _, alive = psutil.wait_procs(engine, timeout=30)
        left = []  # what is still alive, said by name and state (a red run says which), then ended
        for p in alive:
            try:
                left.append(f"{p.pid} {p.name()} {p.status()} ppid {p.ppid()}")
                p.kill()
            except psutil.Error:
                pass
        result = {"me": os.getpid(), "tree": tree, "outputs": outputs, "left": left, "binding": binding}
        print(json.dumps(result, default=str), flush=True)


    if __name__ == "__main__":
        asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
    """
)


def _engine_stage(tiny_model: Path, process_start: str, tmp_path: Path) -> dict:
    script = tmp_path / "engine_stage.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT / "jobimage")])}
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model), process_start, str(tmp_path / "home")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # vLLM may print before it


def _answers_decoded_once(out: dict) -> None:
    """The answer decoded once in the actor is vLLM's own text, and rows leave with only the parsed fields."""
    from icebatch_job.columns import PARSED_FIELDS

    mine, vllms = out["outputs"][0]["__data"]
    assert mine["generated_text"] == vllms["generated_text"] and mine["generated_text"], (mine, vllms)
    assert set(mine) <= set(PARSED_FIELDS) and "generated_tokens" not in mine and "params" not in mine, mine


def _named(tree: list[dict], name: str) -> dict:
    found = [p for p in tree if p["name"] == name]
    assert len(found) == 1, tree
    return found[0]


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def test_the_engine_core_and_its_model_worker_are_forked_from_a_warm_server(tiny_model: Path, tmp_path: Path) -> None:
    # given the job's engine stage with its default; when it starts its engine and answers a prompt
    out = _engine_stage(tiny_model, "forkserver", tmp_path)
    # then the engine core is a child of the fork server (itself a child of the stage's process), and the
    # model worker a child of the engine core: no process imported vLLM from scratch but the server
    core = _named(out["tree"], "VLLM::EngineCore")
    worker = _named(out["tree"], "VLLM::Worker")
    server = next(p for p in out["tree"] if p["pid"] == core["ppid"])
    assert server["ppid"] == out["me"] and server["name"] != "VLLM::EngineCore"
    assert worker["ppid"] == core["pid"]
    # and the forked model worker is bound to the CPUs vLLM binds a spawned one to
    assert sorted(worker["cpus"]) == sorted(out["binding"]) and out["binding"]
    # and the engine answered; on shutdown its processes ended, and the server with the stage's process
    assert out["outputs"][0]["__data"][0]["num_generated_tokens"] == 4
    _answers_decoded_once(out)
    assert out["left"] == []
    assert _gone(server["pid"])


def test_spawn_keeps_vllms_own_way(tiny_model: Path, tmp_path: Path) -> None:
    # given ICEBATCH_ENGINE_PROCESS_START=spawn; when the stage starts its engine
    out = _engine_stage(tiny_model, "spawn", tmp_path)
    # then vLLM spawns the engine core from the stage's process itself, as it does in a Ray actor
    core = _named(out["tree"], "VLLM::EngineCore")
    assert core["ppid"] == out["me"]
    worker = _named(out["tree"], "VLLM::Worker")
    assert worker["ppid"] == core["pid"]
    assert sorted(worker["cpus"]) == sorted(out["binding"]) and out["binding"]
    assert out["outputs"][0]["__data"][0]["num_generated_tokens"] == 4
    _answers_decoded_once(out)
    assert out["left"] == []
