"""A multi-node Ray cluster on 127.0.0.1: a head and worker nodes, each its own ``ray start --block`` process.

This is how KubeRay forms a RayJob's cluster (one ``ray start`` per pod, the head with ``num-cpus: 0`` so
that work lands on the workers), minus Kubernetes. The job then attaches as a RayJob's entrypoint does,
through ``RAY_ADDRESS``. Each node runs in its own session (process group) and is stopped by killing that
group, never with ``ray stop`` (which would stop every Ray on the machine, other tiers' included).

Used by tests/engine/test_scale_out.py and bench/scale_out.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
NODES = (
    "import json, ray; ray.init(address='{address}', logging_level=40); "
    "print(json.dumps([[n['NodeID'], n['Resources'].get('CPU', 0)] for n in ray.nodes() if n['Alive']]))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayCluster:
    address: str
    temp_dir: Path
    log_dir: Path
    env: dict[str, str]
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, log_dir: Path, *, head_cpus: int = 0, worker_cpus: tuple[int, ...] = (4,)) -> RayCluster:
        """Start the head, then each worker node; return once every node is alive (or raise, cleaned up)."""
        # short: Ray's unix sockets live under it (107 bytes at most)
        temp_dir = Path(tempfile.mkdtemp(prefix="ib-ray-", dir="/tmp"))
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        port = free_port()
        cluster = cls(f"127.0.0.1:{port}", temp_dir, log_dir, env)
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            cluster._node("head", ["--head", f"--port={port}", f"--num-cpus={head_cpus}", f"--temp-dir={temp_dir}"])
            cluster.wait_for_nodes(1)
            for i, cpus in enumerate(worker_cpus):
                cluster._node(f"worker-{i}", [f"--address={cluster.address}", f"--num-cpus={cpus}"])
            cluster.wait_for_nodes(1 + len(worker_cpus))
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _node(self, name: str, args: list[str]) -> None:
        ports = [
            f"--dashboard-agent-listen-port={free_port()}",  # nodes on one host must not share the defaults
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ]
        head = ["--include-dashboard=false"] if "--head" in args else []
        argv = [RAY, "start", "--block", "--node-ip-address=127.0.0.1", *head, *ports, *args]
        with (self.log_dir / f"ray-{name}.log").open("wb") as out:
            self.nodes.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
            )

    def alive(self) -> list[tuple[str, float]]:
        """(node id, CPUs) of the alive nodes, asked of the cluster by a short-lived driver."""
        done = subprocess.run(
            [sys.executable, "-c", NODES.format(address=self.address)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        if done.returncode != 0 or not done.stdout.strip():
            return []
        return [(node, float(cpus)) for node, cpus in json.loads(done.stdout.strip().splitlines()[-1])]

    def alive_nodes(self) -> int:
        return len(self.alive())

    def node_ids(self) -> dict[str, list[str]]:
        """The head (no CPUs, as KubeRay's) and the worker nodes."""
        nodes = self.alive()
        return {"head": [n for n, cpus in nodes if not cpus], "workers": [n for n, cpus in nodes if cpus]}

    def wait_for_nodes(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args for p in self.nodes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Ray node exited while starting: {dead}; see {self.log_dir}")
            if self.alive_nodes() >= n:
                return
            time.sleep(1)
        raise TimeoutError(f"{n} Ray nodes were not alive after {timeout} s; see {self.log_dir}")

    @property
    def session_logs(self) -> Path:
        return self.temp_dir / "session_latest" / "logs"

    def stop(self, *, keep_logs: bool = False) -> None:
        """Workers first, then the head: each node's whole process group (raylet, workers, engines); then
        the cluster's temp dir, unless ``keep_logs``."""
        for proc in reversed(self.nodes):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.nodes.clear()
        if not keep_logs:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def engine_replicas(logs: Path) -> dict[int, dict[str, object]]:
    """The vLLM engine actors of a session: pid -> {node, batches} (from Ray's worker logs)."""
    replicas: dict[int, dict[str, object]] = {}
    for err in logs.glob("worker-*.err"):
        text = err.read_text(errors="replace")
        if "vLLMEngineStageUDF" not in text:  # Ray Data LLM's vLLM stage
            continue
        pid = int(err.stem.rsplit("-", 1)[1])
        node = ""
        for core in logs.glob(f"python-core-worker-*_{pid}.log"):
            head = core.read_text(errors="replace")
            if "node_id=" in head:
                node = head.split("node_id=", 1)[1].split()[0]
        replicas[pid] = {"node": node, "batches": text.count("[vLLM] Elapsed time for batch")}
    return replicas
