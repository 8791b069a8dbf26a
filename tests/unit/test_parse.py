"""The driver turns each engine output into exactly one result row, in either shape the pipeline hands it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from icebatch.core.ledger.results_table import STATUS_EMPTY, STATUS_ERROR, STATUS_INVALID, STATUS_OK
from icebatch.core.task import load_task
from icebatch_job.columns import (
    EMPTY_INPUT,
    GENERATED_TEXT,
    INFERENCE_ERROR,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    SAMPLING_PARAMS,
    SOURCE_FILE,
    SOURCE_ID,
    SOURCE_POS,
    TIME_TAKEN_LLM,
    TOKENIZED_PROMPT,
    TRUNCATED,
)
from icebatch_job.stages.parse import ResultParser
from icebatch_job.stages.pipeline import parsed_fields

pytestmark = pytest.mark.unit
TASK = load_task()
GOOD = '{"sentiment":"negative","urgency":"high","category":"billing","summary":"Charged twice"}'


def _engine_row(i: int, **kw: object) -> dict:
    """One row as the vLLM stage hands it on: our columns, its outputs, the prompt's token ids."""
    return {
        SOURCE_ID: f"t-{i}",
        SOURCE_FILE: "s3://w/data/f.parquet",
        SOURCE_POS: i,
        TRUNCATED: False,
        EMPTY_INPUT: False,
        TOKENIZED_PROMPT: [1, 2, 3],
        SAMPLING_PARAMS: {"max_tokens": 160},
        GENERATED_TEXT: GOOD,
        NUM_INPUT_TOKENS: 3,
        NUM_GENERATED_TOKENS: 20,
        TIME_TAKEN_LLM: 0.5,
        **kw,
    }


def test_engine_outputs_as_the_processor_emits_them_become_one_result_row_each() -> None:
    # given a batch as Ray Data LLM's processor emits it with the job's postprocess: answered rows cut to the
    # parsed fields, a failed row with all it had (it skips the postprocess), columns a row lacks filled with
    # None (Ray Data's block builder); one answer valid, one not JSON, one engine failure, one blank ticket
    failed = {k: v for k, v in _engine_row(2, **{INFERENCE_ERROR: "engine died"}).items() if k != GENERATED_TEXT}
    rows = [
        parsed_fields(_engine_row(0)) | {INFERENCE_ERROR: ""},
        parsed_fields(_engine_row(1, **{GENERATED_TEXT: '{"sentiment":"neg'})) | {INFERENCE_ERROR: ""},
        failed,
        parsed_fields(_engine_row(3, **{EMPTY_INPUT: True})) | {INFERENCE_ERROR: ""},
    ]
    names = sorted({k for r in rows for k in r} - {SAMPLING_PARAMS})
    batch = pa.table({k: [r.get(k) for r in rows] for k in names})
    # when the driver parses it
    out = ResultParser(TASK, "run-1", "tiny")(batch).to_pylist()
    # then each row has exactly one result, in order, with its status and what it came from
    assert [r["source_id"] for r in out] == ["t-0", "t-1", "t-2", "t-3"]
    assert [r["status"] for r in out] == [STATUS_OK, STATUS_INVALID, STATUS_ERROR, STATUS_EMPTY]
    assert out[0]["category"] == "billing" and out[0]["num_generated_tokens"] == 20
    assert out[1]["raw_output"] == '{"sentiment":"neg' and out[1]["category"] is None
    assert out[2]["error"] == "engine died"
    assert all(r["source_file"] == "s3://w/data/f.parquet" and r["run_id"] == "run-1" for r in out)
    assert [r["source_pos"] for r in out] == [0, 1, 2, 3]


def test_the_postprocess_sends_on_only_the_parsed_fields() -> None:
    # given an answered row as Ray Data LLM's vLLM stage writes it (prompt ids, sampling parameters and all)
    row = _engine_row(0)
    # when the processor's postprocess keeps what the driver reads
    kept = parsed_fields(row)
    # then the prompt's token ids and the per-row sampling parameters stay behind, the answer goes on
    assert TOKENIZED_PROMPT not in kept and SAMPLING_PARAMS not in kept
    assert kept[GENERATED_TEXT] == GOOD and kept[SOURCE_ID] == "t-0"


def test_flat_endpoint_outputs_parse_the_same_way() -> None:
    # given the endpoint stage's flat columns (no data column)
    flat = {k: [v] for k, v in _engine_row(7).items() if k not in (TOKENIZED_PROMPT, SAMPLING_PARAMS)}
    flat[INFERENCE_ERROR] = [""]
    # when parsed by the driver of an endpoint run (no data column configured)
    out = ResultParser(TASK, "run-2", "endpoint")(pa.table(flat)).to_pylist()
    # then the same result row comes out
    assert len(out) == 1 and out[0]["status"] == STATUS_OK and out[0]["source_id"] == "t-7"
