"""What vLLM says of its engine's start: the checkpoint's load and the warm-up, apart.

vLLM times both and says so only in its log: on a GPU "Model loading took 15.1 GiB memory and 9.87 seconds" (the
model built and its weights in GPU memory, whatever the loader), on CPU "Loading weights took 1.23 seconds" (the
checkpoint read into the model: safetensors and sharded checkpoints; the run:ai streamer and random weights say
nothing there), and "init engine (profile, create kv cache, warmup model) took 4.56 s". The job hands vLLM a
logging configuration of its own (``vllm_logging.json`` in ``VLLM_LOGGING_CONFIG_PATH``, vLLM's documented way to
configure its loggers): vLLM's console output as it would be without it (``console``: ``VLLM_LOGGING_LEVEL`` and
``VLLM_LOGGING_STREAM`` honoured), and a handler (``EngineStartRecorder``) that appends those figures to a file on
the engine's node (``ICEBATCH_ENGINE_START_LOG``), one JSON line each. At the first result the job reads the file
where the engine ran (``engine_start``: a Ray task on each GPU node, or this machine) and reports the weights and
the warm-up beside the start-up.

The configuration is used unless vLLM's logging is configured otherwise (``VLLM_CONFIGURE_LOGGING=0``, a
``VLLM_LOGGING_CONFIG_PATH`` of one's own) or the job logs at DEBUG (vLLM's own configuration then logs everything,
these lines included): the figures are then not reported, as they are not when vLLM's wording changes.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_ENV = "ICEBATCH_ENGINE_START_LOG"
CONFIG = Path(__file__).with_name("vllm_logging.json")

# vLLM's log messages (their format strings) that time a phase of the engine's start: the phase, and which of the
# record's arguments is its seconds. On a GPU the model runner times the whole load ("model_load": the model built
# and its weights in GPU memory, whatever the loader, the run:ai streamer's included); the checkpoint loader times
# the weights it reads (safetensors and sharded checkpoints, on CPU the only figure)
PHASES = {
    "Model loading took": ("model_load", 1),
    "Loading weights took": ("weights", 0),
    "init engine (profile, create kv cache, warmup model) took": ("warm_up", 0),
}


def phase_of(record: logging.LogRecord) -> tuple[str, float] | None:
    """The start-up phase a vLLM log record times, and its seconds; None for any other record."""
    if not isinstance(record.msg, str) or not isinstance(record.args, tuple):
        return None
    timed = next((p for prefix, p in PHASES.items() if record.msg.startswith(prefix)), None)
    if timed is None or len(record.args) <= timed[1]:
        return None
    seconds = record.args[timed[1]]
    if not isinstance(seconds, int | float) or not 0 <= seconds < 86_400:
        return None
    return timed[0], float(seconds)


class EngineStartRecorder(logging.Handler):
    """Appends the phases vLLM's log records time to ``path`` (default ``$ICEBATCH_ENGINE_START_LOG``; none: off)."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__(logging.INFO)
        self.path = path if path is not None else os.environ.get(LOG_ENV, "")

    def emit(self, record: logging.LogRecord) -> None:
        timed = phase_of(record)
        if timed is None or not self.path:
            return
        line = {"phase": timed[0], "seconds": timed[1], "at": record.created, "pid": record.process}
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:  # one short line per write: appends do not interleave
                f.write(json.dumps(line) + "\n")
        except OSError:
            self.handleError(record)


def console() -> logging.Handler:
    """vLLM's console handler as its default configuration makes it (level and stream from its variables)."""
    from vllm.logging_utils import NewLineFormatter

    stream = sys.stderr if os.environ.get("VLLM_LOGGING_STREAM") == "ext://sys.stderr" else sys.stdout
    handler = logging.StreamHandler(stream)
    handler.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    handler.setFormatter(
        NewLineFormatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", datefmt="%m-%d %H:%M:%S")
    )
    return handler


def logging_environment(home: Path, *, debug: bool, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that give vLLM the job's logging configuration, writing the phases under ``home``; none when
    vLLM's logging is configured otherwise or the job logs at DEBUG (see the module's docstring)."""
    environ = dict(os.environ) if environ is None else environ
    configured = environ.get("VLLM_LOGGING_CONFIG_PATH", str(CONFIG)) != str(CONFIG)  # a configuration of one's own
    if debug or configured or environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return {}
    # one file per job process: a job's engine starts, not another job's sharing the folder
    path = home / "cache" / "engine-starts" / f"{os.getpid()}.jsonl"
    return {"VLLM_LOGGING_CONFIG_PATH": str(CONFIG), LOG_ENV: str(path)}


@dataclass(frozen=True)
class EngineStart:
    """What the engine's start spent loading the checkpoint and warming up (None: vLLM did not say)."""

    weights_seconds: float | None = None
    warmup_seconds: float | None = None


def read_phases(path: str, since: float) -> list[dict[str, Any]]:
    """The phases recorded in ``path`` from ``since`` (Unix seconds) on, the file then removed (a lingering job's
    next engine start writes a new one); nothing when there is none. Unreadable lines are skipped."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
        file.unlink()
    except OSError:
        return []
    phases = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("at"), int | float) and item["at"] >= since:
            phases.append(item)
    return phases


def summarize(phases: list[dict[str, Any]]) -> EngineStart:
    """Each phase's seconds, the mean over the engine's replicas that recorded it; the weights are the whole model
    load where vLLM timed it (a GPU), else the checkpoint loader's figure."""

    def mean(phase: str) -> float | None:
        seconds = [
            float(p["seconds"]) for p in phases if p.get("phase") == phase and isinstance(p.get("seconds"), int | float)
        ]
        return round(statistics.fmean(seconds), 3) if seconds else None

    return EngineStart(mean("model_load") or mean("weights"), mean("warm_up"))


def engine_start(since: float, timeout: float = 30.0) -> EngineStart:
    """The phases of the engine starts since ``since``, read where the engines ran: on each GPU node (a Ray task
    there), else on this machine. Nothing recorded (the configuration not in use, vLLM's wording changed, the nodes
    did not answer): an ``EngineStart`` of Nones."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return EngineStart()
    from icebatch_job.process.node_clock import on_gpu_nodes

    remote = on_gpu_nodes(read_phases, path, since, timeout=timeout)
    if remote is None:
        return summarize(read_phases(path, since))
    return summarize([phase for node in remote for phase in node])
