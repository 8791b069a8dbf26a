"""The job as its own process tree (``python -m icebatch_job run``, as the RayJob runs it), for fault injection.

``JobProcess`` starts the job in a new session with the pod's environment (``Settings.job_environment``
and the consumer as ``ICEBATCH_JOB_CONSUMER``), waits for a failpoint's marker file, and kills the whole
tree: the driver, the Ray processes it started and their workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from icebatch.core.consumers import Consumer, job_consumers_json
from icebatch.core.settings import Settings


@dataclass
class JobProcess:
    proc: subprocess.Popen[str]
    home: Path
    log: Path

    @property
    def markers(self) -> Path:
        return self.home / "failpoints"

    def wait_for_failpoint(self, timeout: float = 300) -> str | None:
        """The failpoint reached (its marker's name), or None when the job ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reached = sorted(p.name for p in self.markers.glob("*")) if self.markers.exists() else []
            if reached:
                return reached[0]
            if self.proc.poll() is not None:
                return None
            time.sleep(0.05)
        alive = "; ".join(_described(p) for p in self.tree())
        self.kill_tree()
        raise TimeoutError(
            f"the job reached no failpoint in {timeout} s (still running: {alive or 'nothing'});"
            f" the end of its output:\n{self.output()[-4000:]}"
        )

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill_tree(self) -> None:
        """SIGKILL to every process of the job: no handler runs, nothing is flushed."""
        procs = self.tree()
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)
        self.proc.wait(30)
        self._clear_markers()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        """Until ``text`` is in the job's stderr (e.g. its acknowledgement of a signal)."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{text!r} not in the job's output: {self.output()[-2000:]}")
            time.sleep(0.05)

    def wait(self, timeout: float = 300) -> int:
        """The job's exit status; the rest of its tree is reaped too (a stopped driver stops its Ray)."""
        code = self.proc.wait(timeout)
        leftovers = [p for p in self.tree() if p.pid != self.proc.pid]
        psutil.wait_procs(leftovers, timeout=30)
        for p in leftovers:
            if p.is_running():
                p.kill()
        self._clear_markers()
        return code

    def output(self) -> str:
        """The process's stderr, then the consoles of the jobs it ran in-process (``icebatch launch``: Ray's, vLLM's
        and the job's records go there, as to a pod's log)."""
        consoles = sorted((self.home / "jobs").glob("*.log")) if (self.home / "jobs").is_dir() else []
        return self.log.read_text() + "".join(f"\n--- {c.name}\n{c.read_text()}" for c in consoles)

    def result(self) -> dict[str, Any]:
        """The one JSON document a ``--json`` run prints on stdout."""
        assert self.proc.stdout is not None
        return dict(json.loads(self.proc.stdout.read()))

    def _clear_markers(self) -> None:
        if self.markers.exists():
            for marker in self.markers.glob("*"):
                marker.unlink()


def _described(p: psutil.Process) -> str:
    """A process of the job in a few words: its pid, state, CPU time and command (for a timeout's message)."""
    try:
        with p.oneshot():
            return f"{p.pid} {p.status()} {sum(p.cpu_times()[:2]):.0f}s cpu {' '.join(p.cmdline())[:120]}"
    except psutil.Error:
        return f"{p.pid} gone"


def start_job(
    settings: Settings,
    consumer: Consumer,
    *,
    failpoint: str | None = None,
    tag: str = "job",
    extra_env: dict[str, str] | None = None,
    launch: bool = False,
    shared_with: Sequence[Consumer] = (),
) -> JobProcess:
    """``python -m icebatch_job run --json`` in its own session, with the environment a RayJob's pod gets
    (``extra_env``: e.g. ``RAY_ADDRESS``, as KubeRay sets it for the entrypoint), a shared job's with ``shared_with``.
    ``launch``: instead, ``icebatch launch --force`` for the consumer, which runs the job in its own process (the
    embedded default)."""
    if launch:
        env = settings.job_environment(failpoint=failpoint)
        env["ICEBATCH_CONSUMERS_FILE"] = str(settings.launch.consumers_file)
        command = ["-m", "icebatch.tools.cli", "launch", "--force", "--consumer", consumer.name, "--json"]
    else:
        env = settings.job_environment(job_consumer=job_consumers_json([consumer, *shared_with]), failpoint=failpoint)
        command = ["-m", "icebatch_job", "run", "--json"]
        if shared_with:
            command += ["--consumer", consumer.name, *(a for c in shared_with for a in ("--with", c.name))]
    env.update({k: os.environ[k] for k in ("PATH", "PYTHONPATH", "HOME", "HF_HUB_OFFLINE") if k in os.environ})
    env.update(extra_env or {})
    log = settings.home / f"{tag}-{time.monotonic_ns()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, *command],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            start_new_session=True,
        )
    return JobProcess(proc, settings.home, log)
