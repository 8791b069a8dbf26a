"""Pipeline efficiency: the icebatch job's pipeline vs a bare ``vllm.LLM`` over the same prompts.

Same model (the tiny local one unless ICEBATCH_MODEL_SOURCE says otherwise), same token ids, same
sampling and structured output, in one run. Reported:

- steady-state generation throughput (output tokens per second once results flow) and its ratio
  pipeline / bare (goal >= 0.95);
- fixed start-up overhead: pipeline start (Ray included) -> first token vs the bare engine's start (importing
  vLLM and constructing ``LLM``, as the pipeline's engine actor must) (goal <= 1.5x). The first token is
  the first result's arrival less the engine time of its batch (``llm_seconds``, measured by the engine
  stage); the first result's arrival is reported too;
- output tokens per row.

    python -m bench.pipeline_vs_bare --rows 1000
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from bench.common import table, write


def prompts_for(task, tokenizer_path: str, rows: list[dict], max_model_len: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    from icebatch_job.prompts import PromptBuilder
    from transformers import AutoTokenizer

    builder = PromptBuilder(task, AutoTokenizer.from_pretrained(tokenizer_path), max_model_len)
    return [builder.build(r).token_ids for r in rows]


def bare(model: str, token_ids: list[list[int]], task, settings) -> dict:  # type: ignore[no-untyped-def]
    from icebatch_job.pipeline import engine_config

    kwargs = dict(engine_config(settings, model, "cpu").engine_kwargs)
    t0 = time.perf_counter()  # a fresh engine pays for importing vLLM too, as the pipeline's engine actor does
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    llm = LLM(model=model, **kwargs)
    start = time.perf_counter() - t0
    params = SamplingParams(**task.sampling, structured_outputs=StructuredOutputsParams(json=task.output_schema_json))
    t1 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in token_ids], params, use_tqdm=False)
    gen = time.perf_counter() - t1
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    ok = sum(task.parse(o.outputs[0].text)[0] is not None for o in outs)
    del llm
    gc.collect()
    return {"start_s": start, "generate_s": gen, "output_tokens": tokens, "ok": ok, "tok_per_s": tokens / gen}


def triage(settings):  # type: ignore[no-untyped-def]
    """The benchmark's consumer: the embedded default's ticket triage."""
    from icebatch.core.consumers import consumer_named, load_consumers

    return consumer_named(load_consumers(settings), "triage")


def pipeline(settings, rows: int) -> dict:  # type: ignore[no-untyped-def]
    from icebatch.core.catalog import open_catalog
    from icebatch.core.ledger import open_ledger
    from icebatch_job.done import DoneRows
    from icebatch_job.pipeline import build_pipeline
    from icebatch_job.results import batch_engine_seconds
    from icebatch_job.runtime import init_ray, prepare_environment
    from icebatch_job.source import plan_range, read_dataset

    consumer = triage(settings)
    task = consumer.task
    ledger = open_ledger(settings, consumer)
    plan = ledger.plan()
    assert plan is not None
    t0 = time.perf_counter()
    env = prepare_environment(settings, device="cpu")
    init_ray(settings, env)
    t_ray = time.perf_counter()
    source = open_catalog(settings).load_table(settings.catalog.source_table)
    ds = read_dataset(plan_range(source, plan, (task.id_column, *task.input_columns)), DoneRows())
    built = build_pipeline(
        ds, task, settings, run_id=plan.run_id, model=str(settings.engine.model_source), device="cpu"
    )
    t_built = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    first_batch_llm_s = 0.0
    for batch in built.dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        arrivals.append((time.perf_counter(), int(batch.column("num_generated_tokens").to_numpy().sum())))
        if len(arrivals) == 1:
            first_batch_llm_s = batch_engine_seconds(batch)  # as the job measures its start-up
    first, last = arrivals[0][0], arrivals[-1][0]
    total = sum(n for _, n in arrivals)
    after_first = total - arrivals[0][1]
    steady = after_first / (last - first) if last > first else float("nan")
    return {
        "phases_s": {"ray_init": t_ray - t0, "plan_and_build": t_built - t_ray, "execute_to_first": first - t_built},
        "first_result_s": first - t0,
        "first_batch_llm_s": first_batch_llm_s,
        "first_token_s": first - t0 - first_batch_llm_s,
        "total_s": last - t0,
        "output_tokens": total,
        "batches": len(arrivals),
        "tok_per_s": steady,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--snapshots", type=int, default=5)
    args = parser.parse_args()

    from icebatch.core.catalog import open_catalog
    from icebatch.core.settings import Settings
    from icebatch_job.model import resolve_model
    from icebatch_job.runtime import prepare_environment
    from icebatch_job.source import iter_batches
    from icebatch_job.tickets import ensure_source_table, generate

    home = Path(tempfile.mkdtemp(prefix="icebatch-bench-"))
    base = Settings.from_env()
    settings = base.with_overrides(home=home, model_source=resolve_model(base))
    prepare_environment(settings, device="cpu")
    consumer = triage(settings)
    task = consumer.task
    table_ = ensure_source_table(open_catalog(settings), settings.catalog.source_table)
    generate(table_, tickets=args.rows, batches=args.snapshots, seed=1)
    from icebatch.core.ledger import open_ledger

    plan = open_ledger(settings, consumer).plan()
    assert plan is not None
    rows = [
        r
        for b in iter_batches(open_catalog(settings).load_table(settings.catalog.source_table), plan)
        for r in b.to_pylist()
    ]
    token_ids = prompts_for(task, str(settings.engine.model_source), rows, settings.engine.max_model_len)

    print(f"bare vllm.LLM over {len(token_ids)} prompts ...", flush=True)
    b = bare(str(settings.engine.model_source), token_ids, task, settings)
    print(f"icebatch pipeline over the same {len(rows)} rows ...", flush=True)
    p = pipeline(settings, len(rows))

    ratio = p["tok_per_s"] / b["tok_per_s"]
    startup = p["first_token_s"] / b["start_s"]
    result = {
        "rows": len(rows),
        "bare": b,
        "pipeline": p,
        "steady_state_ratio": ratio,
        "startup_ratio": startup,
        "output_tokens_per_row": {
            "bare": b["output_tokens"] / len(rows),
            "pipeline": p["output_tokens"] / len(rows),
        },
        "goals": {"steady_state_ratio": ">= 0.95", "startup_ratio": "<= 1.5"},
    }
    path = write("pipeline_vs_bare", result)
    per_row_bare = b["output_tokens"] / len(rows)
    per_row_pipe = p["output_tokens"] / len(rows)
    rows_out = [
        ("measure", "bare vllm.LLM", "icebatch pipeline", "ratio (pipeline/bare)"),
        (
            "steady output tok/s",
            f"{b['tok_per_s']:,.0f}",
            f"{p['tok_per_s']:,.0f}",
            f"{ratio:.2f} (goal >= 0.95)",
        ),
        (
            "start-up s (to first token)",
            f"{b['start_s']:.1f}",
            f"{p['first_token_s']:.1f}",
            f"{startup:.2f} (goal <= 1.5)",
        ),
        ("first result s", "", f"{p['first_result_s']:.1f}", ""),
        ("output tokens / row", f"{per_row_bare:.1f}", f"{per_row_pipe:.1f}", ""),
    ]
    print(table(rows_out))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
