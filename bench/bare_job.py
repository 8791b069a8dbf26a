"""The baseline the job is measured against: a plain script with a bare ``vllm.LLM``, no Ray, no icebatch job.

It does what a user would write by hand: read the source table's rows (pyiceberg), build the same prompts
(the job's ``PromptBuilder``: same template, same token ids), construct ``vllm.LLM`` with the same engine
arguments, generate with the same sampling and structured output, and parse every answer. It writes
nothing back (a stricter baseline than the job, which commits its results). It leaves detokenizing to vLLM
(as tokens arrive, its default), as a hand-written script does. Run as its own process by
``bench.pipeline_vs_bare``, with the job's environment (``ICEBATCH_*``, caches, ``HF_HUB_OFFLINE``):

    python -m bench.bare_job OUT.json   # vLLM prints on stdout: the result goes to a file

Times are wall-clock epochs (``time.time()``), so that the caller can place them against the process's
own start: ``engine_ready_at`` (``LLM`` constructed), ``first_token_at`` (the engine's first step done: the
first tokens exist), ``last_result_at`` (the last request finished).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def run() -> dict[str, Any]:
    started_at = time.time()
    from icebatch.core.catalog import open_catalog
    from icebatch.core.consumers import consumer_named, load_consumers
    from icebatch.core.settings import Settings
    from icebatch_job.process.runtime import engine_has_native_bf16
    from icebatch_job.stages.pipeline import engine_config
    from icebatch_job.stages.prompts import PromptBuilder
    from transformers import AutoTokenizer

    settings = Settings.from_env()
    task = consumer_named(load_consumers(settings), "triage").task
    model = str(settings.engine.model_source)
    table = open_catalog(settings).load_table(settings.catalog.source_table)
    rows = table.scan(selected_fields=(task.id_column, *task.input_columns)).to_arrow().to_pylist()
    builder = PromptBuilder(task, AutoTokenizer.from_pretrained(model), settings.engine.max_model_len)
    prompts = [builder.build(r).token_ids for r in rows]
    read_at = time.time()

    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    device = settings.engine.device if settings.engine.device != "auto" else "cpu"
    llm = LLM(
        model=model, **engine_config(settings, model, device, native_bf16=engine_has_native_bf16(device)).engine_kwargs
    )
    engine_ready_at = time.time()
    structured = StructuredOutputsParams(json=task.output_schema_json) if settings.engine.structured_output else None
    params = SamplingParams(
        **task.sampling.params(),
        structured_outputs=structured,
        output_kind=RequestOutputKind.FINAL_ONLY,  # as LLM.generate sets it
    )
    engine = llm.llm_engine
    # LLM.generate's own loop (add every request, step until none is left), timed: the first step returns
    # with the first tokens generated; the last returns the last result.
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": ids}, params)
    first_token_at = 0.0
    finished: list[Any] = []
    while engine.has_unfinished_requests():
        finished.extend(out for out in engine.step() if out.finished)
        first_token_at = first_token_at or time.time()
    last_result_at = time.time()
    tokens = sum(len(o.outputs[0].token_ids) for o in finished)
    ok = sum(task.parse(o.outputs[0].text or "")[0] is not None for o in finished)
    return {
        "rows": len(rows),
        "results": len(finished),
        "ok": ok,
        "output_tokens": tokens,
        "started_at": started_at,
        "read_at": read_at,
        "engine_ready_at": engine_ready_at,
        "first_token_at": first_token_at,
        "last_result_at": last_result_at,
    }


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m bench.bare_job OUT.json")
    result = run()
    Path(sys.argv[1]).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
