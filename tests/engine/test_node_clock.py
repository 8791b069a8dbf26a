"""The job reads the GPU node's start where its engine runs, in a Ray task pinned there (process.node_clock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine]

# a Ray instance as the local backend starts one, its node advertising GPUs or not, and the job's reading of it
READ = """
import json, sys
import ray
from icebatch.core.settings import Settings
from icebatch_job.local.ray_instance import start_local_ray
from icebatch_job.process.node_clock import engine_node_clock

start_local_ray(Settings.from_env(), num_cpus=2, num_gpus=int(sys.argv[1]))
clock = engine_node_clock()
ray.shutdown()
print(json.dumps(clock))
"""


def kernel_clock() -> tuple[int, float]:
    """This machine's boot (/proc/stat's btime) and its PID 1's start, read from the kernel's files here."""
    btime = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    ticks = int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19])
    return btime, btime + ticks / os.sysconf("SC_CLK_TCK")


def read_in_a_cluster(tmp_path: Path, gpus: int) -> object:
    env = {
        "ICEBATCH_HOME": str(tmp_path / "home"),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", READ, str(gpus)], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_gpu_nodes_boot_and_container_start_are_read_on_that_node(tmp_path: Path) -> None:
    # given a Ray cluster whose node has a GPU (this machine, advertising one)
    # when the job reads the GPU node's clock
    clock = read_in_a_cluster(tmp_path, gpus=1)
    # then it is that node's kernel's: its boot, and its PID 1's start
    booted, container = kernel_clock()
    assert isinstance(clock, list) and clock[0] == booted
    assert clock[1] == pytest.approx(container, abs=0.05)


def test_with_no_gpu_node_there_is_no_engine_node_to_read(tmp_path: Path) -> None:
    # given a cluster of CPU nodes (the engine on this machine's CPU), then nothing is read: the job keeps the split
    # of the node its own process runs on
    assert read_in_a_cluster(tmp_path, gpus=0) is None


# the job's reading of what vLLM said of the engine's start, where the engine ran (process.engine_start)
READ_PHASES = """
import json, sys
import ray
from icebatch.core.settings import Settings
from icebatch_job.local.ray_instance import start_local_ray
from icebatch_job.process.engine_start import engine_start

start_local_ray(Settings.from_env(), num_cpus=2, num_gpus=1)
start = engine_start(since=100.0)
ray.shutdown()
print(json.dumps([start.weights_seconds, start.warmup_seconds]))
"""


def test_what_vllm_said_of_its_start_is_read_on_the_gpu_node(tmp_path: Path) -> None:
    # given the phases vLLM's processes recorded on the GPU node (this machine, advertising one)
    phases = tmp_path / "engine-starts.jsonl"
    phases.write_text(
        json.dumps({"phase": "weights", "seconds": 2.5, "at": 101.0})
        + "\n"
        + json.dumps({"phase": "warm_up", "seconds": 7.0, "at": 102.0})
        + "\n"
    )
    env = {
        "ICEBATCH_HOME": str(tmp_path / "home"),
        "ICEBATCH_ENGINE_START_LOG": str(phases),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "HF_HUB_OFFLINE": "1",
    }
    # when the job reads them at its first result
    done = subprocess.run(
        [sys.executable, "-c", READ_PHASES], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # then they are that node's, read by a task there, and the file is gone with the reading
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2.5, 7.0]
    assert not phases.exists()
