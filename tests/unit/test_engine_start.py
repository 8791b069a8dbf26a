"""What vLLM says its engine's start spent, kept through the logging configuration the job gives it
(icebatch_job.process.engine_start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from icebatch.core.settings import Settings
from icebatch_job.process.engine_start import (
    CONFIG,
    LOG_ENV,
    PHASES,
    EngineStart,
    logging_environment,
    read_phases,
    summarize,
)

# vLLM configures its loggers from VLLM_LOGGING_CONFIG_PATH when vllm.logger is first imported; its loader and its
# engine core then log as they do when an engine starts (the same loggers, the same messages)
VLLM_LOGS = """
from vllm.logger import init_logger
init_logger("vllm.model_executor.model_loader.default_loader").info("Loading weights took %.2f seconds", 1.25)
init_logger("vllm.v1.engine.core").info("init engine (profile, create kv cache, warmup model) took %.2f s", 4.5)
init_logger("vllm.v1.engine.core").info(
    "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)", 9.0, 3.0
)
init_logger("vllm.v1.worker.gpu_model_runner").info(
    "Model loading took %s GiB memory and %.6f seconds", "15.1", 9.875
)
init_logger("vllm.config").info("Loading weights took place elsewhere")
init_logger("vllm.config").warning("a warning vLLM prints")
"""


def run_vllm_logging(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", VLLM_LOGS], env=base | env, capture_output=True, text=True, timeout=120, check=False
    )


def test_vllm_with_the_jobs_configuration_records_each_phase_and_prints_as_it_would(tmp_path: Path) -> None:
    # given vLLM's processes started with the job's logging variables, vLLM's own at the job's WARNING
    env = logging_environment(tmp_path, debug=False, environ={})
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    # when vLLM logs its start
    done = run_vllm_logging(env)
    assert done.returncode == 0, done.stderr[-2000:]
    # then the two timings are kept, one line each, and nothing else
    phases = [json.loads(line) for line in Path(env[LOG_ENV]).read_text().splitlines()]
    assert [(p["phase"], p["seconds"]) for p in phases] == [
        ("weights", 1.25),
        ("warm_up", 4.5),
        ("warm_up", 9.0),
        ("model_load", 9.875),
    ]
    # and the console shows what vLLM's default configuration would at that level: the warning, no INFO line
    assert "a warning vLLM prints" in done.stdout and "Loading weights" not in done.stdout + done.stderr


def test_vllm_configured_otherwise_or_at_debug_gets_no_configuration_of_the_jobs(tmp_path: Path) -> None:
    # given the job at DEBUG, vLLM's logging off, or a configuration of one's own, then the job leaves vLLM's alone
    assert logging_environment(tmp_path, debug=True, environ={}) == {}
    assert logging_environment(tmp_path, debug=False, environ={"VLLM_CONFIGURE_LOGGING": "0"}) == {}
    assert logging_environment(tmp_path, debug=False, environ={"VLLM_LOGGING_CONFIG_PATH": "/etc/mine.json"}) == {}
    # and the job's own, exported already (a second run in the same process), is the job's still
    ours = logging_environment(tmp_path, debug=False, environ={"VLLM_LOGGING_CONFIG_PATH": str(CONFIG)})
    assert ours["VLLM_LOGGING_CONFIG_PATH"] == str(CONFIG) and ours[LOG_ENV].startswith(str(tmp_path))
    # and a process that inherits them still reads its settings (the variable is the job's, not a setting)
    assert Settings.from_env({"ICEBATCH_HOME": str(tmp_path), **ours}).home == tmp_path


def test_the_phases_since_the_engine_started_are_read_once_and_averaged_over_replicas(tmp_path: Path) -> None:
    # given a file with an earlier engine start's phases, two replicas' and a line cut short
    path = tmp_path / "starts.jsonl"
    lines = [
        {"phase": "weights", "seconds": 50.0, "at": 90.0},
        {"phase": "weights", "seconds": 2.0, "at": 101.0},
        {"phase": "warm_up", "seconds": 6.0, "at": 102.0},
        {"phase": "weights", "seconds": 4.0, "at": 103.0},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"phase": "warm_')
    # when the job reads those since its engine started
    start = summarize(read_phases(str(path), since=100.0))
    # then each phase is the mean of this start's replicas, the earlier start left out
    assert start == EngineStart(weights_seconds=3.0, warmup_seconds=6.0)
    # and the file is gone: a lingering job's next engine start is read from its own lines
    assert not path.exists() and read_phases(str(path), since=0) == []
    assert summarize([]) == EngineStart(None, None)
    # and on a GPU, where vLLM times the whole model load (the streamer's too), that is the weights' figure
    gpu = [{"phase": "weights", "seconds": 2.0}, {"phase": "model_load", "seconds": 2.5}]
    assert summarize(gpu).weights_seconds == 2.5


@pytest.mark.parametrize("prefix", sorted(PHASES))
def test_the_installed_vllm_still_says_each_phase_in_those_words(prefix: str) -> None:
    # given the vLLM this job runs with, then each message the job reads is one of its log calls (a release that
    # rewords it fails here, and in `make test-upgrade`, not silently in a report)
    import vllm

    root = Path(vllm.__file__).parent
    sources = [p for p in root.rglob("*.py") if prefix in p.read_text(encoding="utf-8", errors="replace")]
    assert sources, f"no vLLM module logs {prefix!r}"
