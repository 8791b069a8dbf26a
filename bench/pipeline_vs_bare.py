"""What the job costs against a bare engine: whole processes, end to end, over the same rows.

Two processes over the same generated tickets (same seed, each in its own fresh home, sharing one warm
model cache), alternated in one run (B J, then J B, ...) so that drift on a noisy machine hits both:

- **bare**: ``python -m bench.bare_job``: a plain script that reads the table, builds the same prompts,
  constructs ``vllm.LLM`` with the job's engine arguments and generates with the same sampling and
  structured output (``bench/bare_job.py``). It writes nothing back.
- **job**: ``python -m icebatch_job run`` as the RayJob runs it: Ray start, read, engine start in Ray
  Data LLM's actors, generation, parsing, chunked commits to Iceberg, the completion event.

Reported, per run and as medians:

- **end-to-end ratio** (headline): bare process wall / job process wall (goal >= 0.95);
- **generation-phase throughput**: output tokens / (last result - first token), each side measured the
  same way from its own process (the job estimates its first token as its first result less that batch's
  engine time), and its ratio;
- **start-up to first token**: from process start (both sides).

``--model small`` runs both sides on a bigger model of the same kind (a random-weight Llama, hidden 512,
6 layers, ~20 M parameters, vLLM's dummy loader, the tiny tokenizer), which generates several times fewer
tokens per second: more of what a token costs is the model's compute, less the software around it. Its
results file is ``pipeline_vs_bare_small``. ``--output-tokens N`` makes every answer exactly N tokens
(``min_tokens = max_tokens``, end of sequence ignored, no structured output, as ``bench.gpu`` does), so that
both sides generate the same tokens: the comparison is then of equal work.

``--before REV`` runs, in every round beside the other two, the job as it was at git revision ``REV`` (its
``functions`` and ``jobimage``, exported to a temporary folder), over the same rows: what a change to the
job did to its start-up and its whole process, measured in the same run.

    python -m bench.pipeline_vs_bare --rows 2000 [--runs 3] [--model tiny|small] [--output-tokens N] [--before REV]
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

from bench.common import median, random_weight_model, table, write

PASS_ENV = ("PATH", "PYTHONPATH", "HOME", "HF_HUB_OFFLINE")
# the tiny model's architecture, grown (vocabulary and tokenizer unchanged): ~20 M parameters against 1.4 M
SMALL_SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
}


def _home(root: Path, name: str, rows: int, model: str, **overrides: Any) -> Any:
    """A fresh home with the tickets every home of this run gets (same seed) and the triage consumer."""
    from icebatch.core.catalog import open_catalog
    from icebatch.core.settings import Settings
    from icebatch_job.example.tickets import ensure_source_table, generate

    settings = Settings.from_env().with_overrides(home=root / name, model_source=model, **overrides)
    generate(
        ensure_source_table(open_catalog(settings), settings.catalog.source_table), tickets=rows, batches=5, seed=1
    )
    return settings


def _environment(settings: Any, cache: Path) -> dict[str, str]:
    """The job's environment (its settings and consumer) with the caches both sides share."""
    from icebatch.core.consumers import consumer_named, load_consumers
    from icebatch_job.process.runtime import job_environment

    consumer = consumer_named(load_consumers(settings), "triage")
    env = settings.job_environment(job_consumer=consumer.to_json())
    device = "gpu" if settings.engine.device == "gpu" else "cpu"
    env.update(job_environment(settings.with_overrides(home=cache), device=device))  # one warm model cache
    env.update({k: os.environ[k] for k in PASS_ENV if k in os.environ})
    return env


def _process(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float, str]:
    """Run one whole process; (its start on the wall clock, its wall seconds, its stdout)."""
    started = time.time()
    t0 = time.perf_counter()
    with log.open("w") as err:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv[2]} failed (exit {done.returncode}); see {log}")
    return started, wall, done.stdout


def run_bare(settings: Any, cache: Path) -> dict[str, Any]:
    out = settings.home / "bare.json"
    started, wall, _ = _process(
        [sys.executable, "-m", "bench.bare_job", str(out)], _environment(settings, cache), settings.home / "bare.log"
    )
    r = json.loads(out.read_text())
    return _side(wall, started, r["rows"], r["output_tokens"], r["first_token_at"], r["last_result_at"], r["ok"])


def run_job(settings: Any, cache: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    env = {**_environment(settings, cache), **(extra_env or {})}
    if "ICEBATCH_BENCH_CODE" in env:  # --before: the job's code as it was (its packages first on the path)
        code = Path(env.pop("ICEBATCH_BENCH_CODE"))
        env["PYTHONPATH"] = os.pathsep.join(
            [str(code / "functions"), str(code / "jobimage"), env.get("PYTHONPATH", "")]
        )
    started, wall, stdout = _process(
        [sys.executable, "-m", "icebatch_job", "run", "--json"], env, settings.home / "job.log"
    )
    r = _one_document(stdout, settings.home / "job.log")
    return _side(wall, started, r["rows"], r["output_tokens"], r["first_token_at"], r["last_result_at"], r["rows_ok"])


def _one_document(stdout: str, log: Path) -> dict[str, Any]:
    """The job's summary: with ``--json`` its stdout is exactly one JSON document (anything else is a broken contract,
    said with what was printed)."""
    try:
        return dict(json.loads(stdout))
    except json.JSONDecodeError as e:
        raise SystemExit(
            f"the job's --json stdout is not one JSON document ({e}); it printed:\n{stdout[-3000:]}\n"
            f"(its stderr: {log})"
        ) from e


def _side(wall: float, started: float, rows: int, tokens: int, first: float, last: float, ok: int) -> dict[str, Any]:
    return {
        "wall_s": wall,
        "rows": rows,
        "ok": ok,
        "output_tokens": tokens,
        "first_token_s": first - started,  # start-up: process start -> first token
        "generation_s": last - first,
        "generation_tok_per_s": tokens / (last - first),
    }


def _dtype() -> str:
    """The dtype both sides' engines ran in on this machine (``auto``: the model's own)."""
    from icebatch.core.settings import Settings
    from icebatch_job.process.runtime import engine_has_native_bf16
    from icebatch_job.stages.pipeline import engine_dtype

    engine = Settings.from_env().engine
    device = "gpu" if engine.device == "gpu" else "cpu"
    return engine_dtype(engine.dtype, device, native_bf16=engine_has_native_bf16(device))


def small_model(root: Path) -> str:
    """``--model small``: the tiny model's config grown to ``SMALL_SHAPE``, random weights (dummy loader)."""
    from icebatch.core.settings import Settings
    from icebatch_job.stages.model import resolve_model

    config = json.loads((Path(resolve_model(Settings.from_env())) / "config.json").read_text())
    return str(random_weight_model(root / "small-llama", {**config, **SMALL_SHAPE}))


def warm_start(prefix: str, size: str = "tiny") -> tuple[str, Path, Path, dict[str, Any]]:
    """The model, a fresh root for the run's homes, the model cache they share (warmed by a small bare run,
    not timed, so that no side pays for a cold cache the other does not) and the settings both sides get."""
    from icebatch.core.settings import Settings
    from icebatch_job.stages.model import resolve_model

    root = Path(tempfile.mkdtemp(prefix=prefix))
    model = small_model(root) if size == "small" else resolve_model(Settings.from_env())
    overrides: dict[str, Any] = {"model_load_format": "dummy"} if size == "small" else {}
    print("warming the shared model cache (a small bare run, not timed) ...", flush=True)
    run_bare(_home(root, "warm", 16, model, **overrides), root / "shared")
    return model, root, root / "shared", overrides


def export_revision(rev: str, root: Path) -> Path:
    """The repository's ``functions`` and ``jobimage`` at ``rev``, in a folder of ``root``."""
    repo = Path(__file__).resolve().parents[1]
    folder = root / f"code-{rev.replace('/', '_')}"
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", rev, "functions", "jobimage"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1, help="pairs of processes (bare, job), order alternated")
    parser.add_argument(
        "--model", choices=("tiny", "small"), default="tiny", help="tiny (1.4 M parameters) or small (~20 M, random)"
    )
    parser.add_argument(
        "--output-tokens", type=int, default=None, help="every answer exactly this many tokens (equal work)"
    )
    parser.add_argument("--before", metavar="REV", default=None, help="also run the job as it was at git REV")
    args = parser.parse_args()

    model, root, cache, overrides = warm_start("icebatch-bench-e2e-", args.model)
    if args.output_tokens is not None:
        from bench.gpu import fixed_length_consumers

        overrides |= {
            "structured_output": False,
            "consumers_file": fixed_length_consumers(root / "consumers", args.output_tokens),
        }
    sides = ["bare", "job"] + (["before"] if args.before else [])
    before_env = {"ICEBATCH_BENCH_CODE": str(export_revision(args.before, root))} if args.before else {}
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        order = sides[i % len(sides) :] + sides[: i % len(sides)]  # each side first in turn
        order = order if i % 2 == 0 else order[::-1]
        sample: dict[str, Any] = {}
        for side in order:
            settings = _home(root, f"{side}-{i}", args.rows, model, **overrides)
            print(f"[run {i + 1}/{args.runs}] {side}: {args.rows} rows ...", flush=True)
            if side == "bare":
                sample[side] = run_bare(settings, cache)
            else:
                sample[side] = run_job(settings, cache, before_env if side == "before" else None)
            print(f"    {sample[side]['wall_s']:.1f} s", flush=True)
        sample["ratio"] = sample["bare"]["wall_s"] / sample["job"]["wall_s"]
        runs.append(sample)

    def med(side: str, key: str) -> float:
        return median([r[side][key] for r in runs])

    ratio = median([r["ratio"] for r in runs])
    gen_ratio = med("job", "generation_tok_per_s") / med("bare", "generation_tok_per_s")
    result = {
        "rows": args.rows,
        "model": args.model,
        "runs": runs,
        "end_to_end_ratio": ratio,
        "end_to_end_ratio_spread": [round(min(r["ratio"] for r in runs), 3), round(max(r["ratio"] for r in runs), 3)],
        "median": {side: {k: med(side, k) for k in runs[0][side]} for side in sides},
        "generation_ratio": gen_ratio,
        "engine_dtype": _dtype(),
        "output_tokens_per_row": args.output_tokens,  # None: the task's answers, as long as the model makes them
        "goals": {"end_to_end_ratio": ">= 0.95"},
    }
    if args.before:
        result["before"] = {
            "revision": args.before,
            "commit": subprocess.run(
                ["git", "rev-parse", args.before], capture_output=True, text=True, check=True
            ).stdout.strip(),
            "end_to_end_ratio": median([r["bare"]["wall_s"] / r["before"]["wall_s"] for r in runs]),
            "wall_change_s": med("job", "wall_s") - med("before", "wall_s"),
            "first_token_change_s": med("job", "first_token_s") - med("before", "first_token_s"),
        }
    path = write("pipeline_vs_bare" if args.model == "tiny" else "pipeline_vs_bare_small", result)
    spread = result["end_to_end_ratio_spread"]
    print(
        table(
            [
                ("measure (median)", "bare vllm.LLM script", "icebatch job", "ratio"),
                (
                    "process wall s",
                    f"{med('bare', 'wall_s'):.1f}",
                    f"{med('job', 'wall_s'):.1f}",
                    f"{ratio:.2f} bare/job (goal >= 0.95; runs {spread[0]:.2f}-{spread[1]:.2f})",
                ),
                (
                    "start-up to first token s",
                    f"{med('bare', 'first_token_s'):.1f}",
                    f"{med('job', 'first_token_s'):.1f}",
                    "",
                ),
                (
                    "generation output tok/s",
                    f"{med('bare', 'generation_tok_per_s'):,.0f}",
                    f"{med('job', 'generation_tok_per_s'):,.0f}",
                    f"{gen_ratio:.2f} job/bare",
                ),
                ("output tokens", f"{med('bare', 'output_tokens'):,.0f}", f"{med('job', 'output_tokens'):,.0f}", ""),
            ]
        )
    )
    if args.before:
        b = result["before"]
        print(
            f"\nthe job at {args.before}: {med('before', 'wall_s'):.1f} s whole "
            f"({b['end_to_end_ratio']:.2f} bare/job), "
            f"first token at {med('before', 'first_token_s'):.1f} s; now {b['wall_change_s']:+.1f} s whole, "
            f"{b['first_token_change_s']:+.1f} s to the first token"
        )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
