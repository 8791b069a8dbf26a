"""The job against a bare ``vllm.LLM`` on one NVIDIA GPU, with a real model architecture and random weights.

No download: the model is the Llama-3.1-8B architecture from ``bench/gpu/llama-3.1-8b.json`` with vLLM's
``load_format=dummy`` (random weights; the architecture's cost, not its answers) and the tiny local
tokenizer for the prompts. Every row generates exactly ``--output-tokens`` tokens (322 by default, the
seed's tickets: ``ignore_eos``, ``min_tokens`` = ``max_tokens``), without structured output (a random
model's JSON would end early). vLLM detokenizes the answers on both sides (the job parses text); a random
model's token ids can lie outside the tokenizer's vocabulary, and this bench has not run on a GPU since the job
stopped decoding answers itself (8b3190f). Both sides
are whole processes over the same tickets, as in ``bench.pipeline_vs_bare``.

Run it in the job image on a GPU node (it needs vLLM's CUDA build); it exits non-zero with one line on a
machine without a usable GPU, before starting anything. About 7 minutes on one L40S at the defaults.

    python -m bench.gpu [--rows 800] [--output-tokens 322] [--usd-per-hour 1.861]

Results file ``bench/results/gpu-<UTC time>.json`` (and ``gpu-latest.json``): ``machine`` (CPU, GPU
name and memory, versions), ``model`` (the config's name, parameters), ``rows``, ``output_tokens_per_row``,
``usd_per_hour``, and for ``bare`` and ``job``: ``wall_s`` (process start to exit), ``first_token_s``
(process start to first token), ``generation_s`` and ``generation_tok_per_s`` (output tokens / (last
result - first token)), ``tok_per_s_per_gpu``, ``peak_gpu_memory_mib`` (nvidia-smi, sampled each second),
``usd_per_1k_rows`` (the process's wall time at ``usd_per_hour``); ``end_to_end_ratio`` (bare wall / job
wall) and ``generation_ratio`` (job tok/s / bare tok/s). The seed measured 2,776 output tok/s on one L40S.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench.common import random_weight_model, table, write

CONFIG = Path(__file__).parent / "gpu" / "llama-3.1-8b.json"
L40S_USD_PER_HOUR = 1.861  # g6e.xlarge on-demand, us-east-1 (icebatch.core.costs.instances)


def gpu_or_exit() -> list[str]:
    """The GPUs' names and memory, or SystemExit with one line saying why the benchmark cannot run here."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise SystemExit("bench-gpu: no NVIDIA GPU here (nvidia-smi not found); run it in the job image on a GPU node")
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise SystemExit("bench-gpu: nvidia-smi did not answer within 30 s; is the GPU driver healthy?") from None
    gpus = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not gpus:
        reason = (done.stderr.strip().splitlines() or ["no GPU listed"])[0]
        raise SystemExit(f"bench-gpu: nvidia-smi found no usable GPU ({reason[:200]})")
    probe = "import torch; print(torch.cuda.is_available())"
    try:
        cuda = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise SystemExit("bench-gpu: torch did not initialise CUDA within 120 s") from None
    if cuda.stdout.strip() != "True":
        raise SystemExit("bench-gpu: this Python's torch cannot use the GPU (a CPU build?); run it in the job image")
    return gpus


def build_model(target: Path) -> Path:
    """config.json from the repo plus the tiny local tokenizer: all vLLM's dummy loader needs."""
    return random_weight_model(target, json.loads(CONFIG.read_text()))


def fixed_length_consumers(folder: Path, output_tokens: int) -> Path:
    """The triage consumer with a task that always generates ``output_tokens`` tokens."""
    import yaml

    tasks = Path(__file__).resolve().parents[1] / "functions" / "icebatch" / "consumers" / "tasks"
    task = json.loads((tasks / "triage.json").read_text())
    task["sampling"] = {
        "temperature": 0.0,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "ignore_eos": True,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fixed-length.json").write_text(json.dumps(task))
    path = folder / "consumers.yaml"
    path.write_text(
        yaml.safe_dump({"consumers": [{"name": "triage", "task": "fixed-length.json", "backlog_threshold": 1}]})
    )
    return path


class PeakGpuMemory:
    """nvidia-smi's memory.used, sampled every second while a side runs; the peak in MiB."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            used = [int(x) for x in done.stdout.split() if x.strip().isdigit()]
            self.peak = max([self.peak, *used])

    def __enter__(self) -> PeakGpuMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=800)
    parser.add_argument("--output-tokens", type=int, default=322)
    parser.add_argument("--usd-per-hour", type=float, default=L40S_USD_PER_HOUR)
    args = parser.parse_args()
    gpus = gpu_or_exit()  # before anything heavy: a clear line and a non-zero exit where there is no GPU

    from bench.pipeline_vs_bare import _home, run_bare, run_job

    root = Path(tempfile.mkdtemp(prefix="icebatch-bench-gpu-"))
    model = str(build_model(root / "llama-3.1-8b-random"))
    overrides = {
        "device": "gpu",
        "model_load_format": "dummy",
        "structured_output": False,
        "consumers_file": fixed_length_consumers(root / "consumers", args.output_tokens),
    }
    cache = root / "shared"
    sides: dict[str, dict[str, Any]] = {}
    for side, run in (("bare", run_bare), ("job", run_job)):
        settings = _home(root, side, args.rows, model, **overrides)
        print(f"{side}: {args.rows} rows x {args.output_tokens} tokens on {gpus[0]} ...", flush=True)
        with PeakGpuMemory() as memory:
            sample = run(settings, cache)
        sample["peak_gpu_memory_mib"] = memory.peak
        sample["tok_per_s_per_gpu"] = sample["generation_tok_per_s"] / 1
        sample["usd_per_1k_rows"] = args.usd_per_hour * sample["wall_s"] / 3600 / args.rows * 1000
        sides[side] = sample
        print(f"    {sample['wall_s']:.1f} s", flush=True)
    bare, job = sides["bare"], sides["job"]
    config = json.loads(CONFIG.read_text())
    result = {
        "gpus": gpus,
        "model": {"config": CONFIG.name, "hidden_size": config["hidden_size"], "layers": config["num_hidden_layers"]},
        "rows": args.rows,
        "output_tokens_per_row": args.output_tokens,
        "usd_per_hour": args.usd_per_hour,
        "bare": bare,
        "job": job,
        "end_to_end_ratio": bare["wall_s"] / job["wall_s"],
        "generation_ratio": job["generation_tok_per_s"] / bare["generation_tok_per_s"],
        "seed_reference_tok_per_s": 2776,
    }
    path = write("gpu", result)
    print(
        table(
            [
                ("measure", "bare vllm.LLM", "icebatch job", "ratio"),
                (
                    "process wall s",
                    f"{bare['wall_s']:.1f}",
                    f"{job['wall_s']:.1f}",
                    f"{result['end_to_end_ratio']:.2f}",
                ),
                ("start-up to first token s", f"{bare['first_token_s']:.1f}", f"{job['first_token_s']:.1f}", ""),
                (
                    "output tok/s per GPU",
                    f"{bare['tok_per_s_per_gpu']:,.0f}",
                    f"{job['tok_per_s_per_gpu']:,.0f}",
                    f"{result['generation_ratio']:.2f} (seed: 2,776 on an L40S)",
                ),
                ("peak GPU memory MiB", str(bare["peak_gpu_memory_mib"]), str(job["peak_gpu_memory_mib"]), ""),
                ("$ per 1k rows", f"{bare['usd_per_1k_rows']:.4f}", f"{job['usd_per_1k_rows']:.4f}", ""),
            ]
        )
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
