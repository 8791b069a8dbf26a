"""What chunked commits cost: the whole job process, chunked at the default size vs one commit at the end.

Both sides are ``python -m icebatch_job run`` as the RayJob runs it (Ray start, read, engine start,
generation, commits), over the same generated tickets in two fresh homes, timed from process start to
exit, alternated (A B B A ...) in one run so that drift on a noisy machine hits both sides. The baseline
sets ``ICEBATCH_CHUNK_ROWS`` beyond the range: one commit, no row window. Reported: the throughput ratio
(baseline wall / chunked wall; goal >= 0.97, i.e. chunking costs <= 3 %), each side's commits, the
seconds the chunked job spent writing and committing its chunks before the last as a share of its wall
time (measured inside the process, so free of the start-up noise between processes: an upper bound of
the cost, as the engine keeps generating during a commit), and the rows a kill could redo (one chunk).

    python -m bench.chunk_cost --rows 2000 [--chunk-rows 1000] [--pairs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median, table, write

UNCHUNKED = 1_000_000  # more than any range here: a single commit at the end


def _home(root: Path, name: str, rows: int, model: str) -> Any:
    """A fresh home with the same generated tickets (same seed) and the triage consumer."""
    from icebatch.core.catalog import open_catalog
    from icebatch.core.settings import Settings
    from icebatch_job.example.tickets import ensure_source_table, generate

    settings = Settings.from_env().with_overrides(home=root / name, model_source=model)
    table_ = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    generate(table_, tickets=rows, batches=5, seed=1)
    return settings


def _run(settings: Any, chunk_rows: int) -> dict[str, Any]:
    """One job process, end to end; its wall time and what it reported."""
    from icebatch.core.consumers import consumer_named, load_consumers

    consumer = consumer_named(load_consumers(settings), "triage")
    env = settings.job_environment(job_consumer=consumer.to_json(), chunk_rows=chunk_rows)
    env.update({k: os.environ[k] for k in ("PATH", "PYTHONPATH", "HOME", "HF_HUB_OFFLINE") if k in os.environ})
    log = settings.home / f"job-{chunk_rows}-{time.monotonic_ns()}.log"
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "icebatch_job", "run", "--json"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the job failed (exit {proc.returncode}); see {log}")
    result = json.loads(proc.stdout)  # --json: stdout is exactly the job's summary
    return {
        "wall_s": wall,
        "rows": result["rows"],
        "commits": result["chunks"],
        "chunk_commit_s": result["chunk_commit_seconds"],
        "log": str(log),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--chunk-rows", type=int, default=None, help="default: the setting's default")
    parser.add_argument("--pairs", type=int, default=1, help="A B B A is one pair of each side")
    args = parser.parse_args()

    from icebatch.core.settings import Settings
    from icebatch_job.process.runtime import prepare_environment
    from icebatch_job.stages.model import resolve_model

    base = Settings.from_env()
    chunk = args.chunk_rows or base.progress.chunk_rows
    model = resolve_model(base)
    prepare_environment(base, device="cpu")
    root = Path(tempfile.mkdtemp(prefix="icebatch-bench-chunks-"))
    samples: dict[str, list[dict[str, Any]]] = {"chunked": [], "unchunked": []}
    order = ["chunked", "unchunked", "unchunked", "chunked"] * args.pairs
    for i, side in enumerate(order):
        settings = _home(root, f"{side}-{i}", args.rows, model)
        print(f"[{i + 1}/{len(order)}] {side}: job over {args.rows} rows ...", flush=True)
        sample = _run(settings, chunk if side == "chunked" else UNCHUNKED)
        print(f"    {sample['wall_s']:.1f} s, {sample['commits']} commits", flush=True)
        samples[side].append(sample)
    chunked = median([s["wall_s"] for s in samples["chunked"]])
    unchunked = median([s["wall_s"] for s in samples["unchunked"]])
    ratio = unchunked / chunked
    # What chunking adds, measured inside the chunked processes: the seconds the job spent writing and
    # committing chunks before the last (the engine keeps generating meanwhile, so an upper bound).
    commit_share = median([s["chunk_commit_s"] / s["wall_s"] for s in samples["chunked"]])
    result = {
        "rows": args.rows,
        "chunk_rows": chunk,
        "samples": samples,
        "median_wall_s": {"chunked": chunked, "unchunked": unchunked},
        "throughput_ratio": ratio,
        "commits": {side: samples[side][0]["commits"] for side in samples},
        "chunk_commit_share": commit_share,
        "spread": {side: [round(s["wall_s"], 1) for s in samples[side]] for side in samples},
        "goals": {"throughput_ratio": ">= 0.97"},
    }
    path = write("chunk_cost", result)
    print(
        table(
            [
                ("measure", "one commit (baseline)", f"chunks of {chunk:,}", "ratio"),
                ("job process wall s", f"{unchunked:.1f}", f"{chunked:.1f}", f"{ratio:.3f} (goal >= 0.97)"),
                ("ledger commits", str(result["commits"]["unchunked"]), str(result["commits"]["chunked"]), ""),
                ("chunk commits' share of wall", "", f"{commit_share:.1%}", "upper bound of the cost"),
                ("rows a kill can redo", f"{args.rows:,}", f"{chunk:,}", ""),
            ]
        )
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
