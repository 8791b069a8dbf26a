from __future__ import annotations

from pathlib import Path

import pytest
from icebatch.core.task import load_task
from icebatch_job.prompts import PromptBuilder

pytestmark = pytest.mark.unit
TASK = load_task()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _row(body: str | None) -> dict:
    return {"subject": "Export fails", "body": body, "customer_tier": "pro", "channel": "web"}


def test_short_prompts_are_untouched_and_start_with_one_bos(tokenizer) -> None:  # type: ignore[no-untyped-def]
    p = PromptBuilder(TASK, tokenizer, max_model_len=2048).build(_row("It times out."))
    assert not p.truncated
    assert p.token_ids[0] == tokenizer.bos_token_id and p.token_ids[1] != tokenizer.bos_token_id
    assert "It times out." in tokenizer.decode(p.token_ids)


def test_long_bodies_are_truncated_to_fit_and_flagged(tokenizer) -> None:  # type: ignore[no-untyped-def]
    builder = PromptBuilder(TASK, tokenizer, max_model_len=1024)
    p = builder.build(_row("log line: HTTP 502 at worker-7 " * 800))
    assert p.truncated
    assert len(p.token_ids) <= 1024 - TASK.max_tokens
    text = tokenizer.decode(p.token_ids)
    assert "[truncated]" in text and "Subject: Export fails" in text  # the rest of the prompt survives


def test_a_context_too_small_for_any_answer_is_refused(tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="ICEBATCH_MAX_MODEL_LEN"):
        PromptBuilder(TASK, tokenizer, max_model_len=160)
