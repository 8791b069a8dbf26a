"""vLLM's own OpenAI-compatible server on 127.0.0.1, for endpoint-mode tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from icebatch_job.process.runtime import cpu_has_native_bf16
from icebatch_job.stages.pipeline import engine_dtype


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def vllm_openai_server(model: Path, env: dict[str, str], log: Path, timeout: float = 300) -> Iterator[str]:
    """Start `vllm` serving ``model``; yield its base URL (``http://127.0.0.1:PORT/v1``)."""
    port = free_port()
    dtype = engine_dtype("auto", "cpu", native_bf16=cpu_has_native_bf16())  # as the job's engine on this CPU
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--dtype",
        dtype,
        "--structured-outputs-config",
        '{"backend": "guidance", "disable_any_whitespace": true}',
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm server exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm server not healthy after {timeout} s; see {log}")
            time.sleep(1)
        yield base + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
