"""The in-job engine's answers: decoded once, in the engine's actor, and sent on with only what the parse reads.

vLLM's front end (``AsyncLLM``, in the engine stage's actor) detokenizes every request incrementally: at each
engine step, for every running sequence, in the process that also feeds the engine core. The job reads final
answers only (``FINAL_ONLY``), so the in-job engine is asked not to detokenize (``detokenize=False``) and the
answers of a batch are decoded here, in one call, when the batch is done: the same text with less of the CPU
that the engine core and its model worker need (on 2 cores they share it).

Stop strings need vLLM's incremental detokenizer (it matches them as text arrives): a task with ``stop`` keeps
it, as does one that sets ``detokenize`` itself. An answer cut mid-character by ``max_tokens`` ends here with a
replacement character where vLLM's text would leave the incomplete bytes out; such an answer is cut JSON and
fails the parse either way.

Ray Data LLM's stage also adds to each row the prompt, its token ids, the answer's token ids, the sampling
parameters as text (the whole JSON schema, per row) and more; only the fields the driver's parse reads
(``columns.PARSED_FIELDS``) go on through the object store.
"""

from __future__ import annotations

from typing import Any

from icebatch_job.columns import GENERATED_TEXT, GENERATED_TOKENS, INFERENCE_ERROR, PARSED_FIELDS


def engine_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """A task's sampling parameters for the in-job engine: no incremental detokenizing unless it needs it."""
    if params.get("stop") or "detokenize" in params:
        return dict(params)
    return {**params, "detokenize": False}


def finished_rows(rows: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """A batch's engine output rows with their answers decoded (where the engine did not) and only the parsed fields.

    ``tokenizer`` is the engine's (``AsyncLLM.tokenizer``); special tokens are skipped, as vLLM's default
    ``skip_special_tokens`` does. A failed row (``__inference_error__``) is passed on as it is.
    """
    todo = [r for r in rows if not r.get(INFERENCE_ERROR) and not r.get(GENERATED_TEXT) and r.get(GENERATED_TOKENS)]
    if todo:
        texts = tokenizer.batch_decode([list(r[GENERATED_TOKENS]) for r in todo], skip_special_tokens=True)
        for row, text in zip(todo, texts, strict=True):
            row[GENERATED_TEXT] = text
    return [{f: row[f] for f in PARSED_FIELDS if f in row} for row in rows]
