"""The in-job engine's answers are decoded once, in the engine's actor, and sent on with only what the parse reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from icebatch_job.columns import (
    GENERATED_TEXT,
    GENERATED_TOKENS,
    INFERENCE_ERROR,
    NUM_GENERATED_TOKENS,
    PARSED_FIELDS,
    SOURCE_ID,
)
from icebatch_job.stages.engine_outputs import engine_sampling, finished_rows

pytestmark = pytest.mark.unit

ANSWER = '{"sentiment": "negative", "urgency": "high", "category": "billing", "summary": "Charged twice."}'


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _engine_row(source_id: str, tokens: list[int], text: str = "") -> dict:
    """A row as Ray Data LLM's vLLM stage leaves it: our columns, its inputs and everything it adds."""
    return {
        SOURCE_ID: source_id,
        "__icebatch_source_file": "f.parquet",
        "__icebatch_source_pos": 0,
        "__icebatch_source_hash": 7,
        "__icebatch_truncated": False,
        "__icebatch_empty_input": False,
        "tokenized_prompt": [1, 2, 3],
        "sampling_params": {},
        "prompt": "",
        "prompt_token_ids": [1, 2, 3],
        GENERATED_TOKENS: tokens,
        GENERATED_TEXT: text,
        "num_input_tokens": 3,
        NUM_GENERATED_TOKENS: len(tokens),
        "time_taken_llm": 0.5,
        "params": "SamplingParams(n=1, ... structured_outputs=StructuredOutputsParams(json={...}))",
        "request_id": "7",
        "batch_uuid": "b",
        "metrics": None,
        "embeddings": None,
    }


def test_the_in_job_engine_detokenizes_only_when_the_task_needs_it() -> None:
    # given a task's sampling without stop strings; then the engine is asked not to detokenize as tokens arrive
    task = {"max_tokens": 160, "temperature": 0.0}
    assert engine_sampling(task) == {"max_tokens": 160, "temperature": 0.0, "detokenize": False}
    assert task == {"max_tokens": 160, "temperature": 0.0}  # the task's own dict is left as it was
    # and stop strings (vLLM matches them in its detokenized text) or a task's own choice keep vLLM's way
    assert engine_sampling({"max_tokens": 8, "stop": ["\n\n"]}) == {"max_tokens": 8, "stop": ["\n\n"]}
    assert engine_sampling({"max_tokens": 8, "detokenize": True}) == {"max_tokens": 8, "detokenize": True}


def test_answers_are_decoded_once_and_only_the_parsed_fields_go_on(tokenizer) -> None:  # type: ignore[no-untyped-def]
    # given a batch as the engine finished it without detokenizing: an answer's token ids (ending in EOS),
    # one already detokenized by vLLM (a task with stop strings), and a failed row
    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    rows = [
        _engine_row("t-1", [*ids, tokenizer.eos_token_id]),
        _engine_row("t-2", [5, 6], text="vLLM's own text"),
        _engine_row("t-3", []) | {INFERENCE_ERROR: "EngineDeadError: ..."},
    ]
    # when the engine's actor finishes the batch
    out = finished_rows(rows, tokenizer)
    # then the first answer is its text (special tokens skipped, as vLLM does), vLLM's text is kept, and the
    # failed row keeps its error and no invented text
    assert [r[SOURCE_ID] for r in out] == ["t-1", "t-2", "t-3"]
    assert out[0][GENERATED_TEXT] == ANSWER
    assert out[1][GENERATED_TEXT] == "vLLM's own text"
    assert out[2][INFERENCE_ERROR] == "EngineDeadError: ..." and out[2][GENERATED_TEXT] == ""
    # and each row carries only what the driver's parse reads (no token ids, prompt or sampling text)
    assert all(set(r) == set(PARSED_FIELDS) - {INFERENCE_ERROR} for r in out[:2]), [sorted(r) for r in out]
    assert set(out[2]) == set(PARSED_FIELDS)
    assert out[0][NUM_GENERATED_TOKENS] == len(ids) + 1


def test_a_batch_of_failed_rows_is_passed_on_without_decoding() -> None:
    # given a batch whose every row failed (the engine died); when it is finished, then no tokenizer is needed
    rows = [{SOURCE_ID: "t-1", INFERENCE_ERROR: "boom", GENERATED_TEXT: "", "prompt": "p"}]
    assert finished_rows(rows, tokenizer=None) == [{SOURCE_ID: "t-1", INFERENCE_ERROR: "boom", GENERATED_TEXT: ""}]
