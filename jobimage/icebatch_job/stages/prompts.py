"""From source rows to engine requests: chat template, tokens, and truncation to fit the context.

One Ray Data stage does all three (Ray's separate chat-template and tokenize stages each hold an actor
and a CPU; on a small machine they starve the engine). Prompts are handed to vLLM as token ids, so the
engine does not tokenize again.

Row values are untrusted: a ticket body holding ``<|system|>`` or ``</s>`` must not become those special
tokens (a forged turn). The template is rendered around placeholders; its own text is tokenized as
usual, and each value is tokenized with ``split_special_tokens=True``, so that it can only ever be text.
"""

from __future__ import annotations

import re
import secrets
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icebatch.core.task import MIN_PROMPT_TOKENS, TaskSpec

from icebatch_job.columns import (
    EMPTY_INPUT,
    MEMBER,
    SAMPLING_PARAMS,
    SOURCE_FILE,
    SOURCE_HASH,
    SOURCE_ID,
    SOURCE_POS,
    TOKENIZED_PROMPT,
    TRUNCATED,
)

if TYPE_CHECKING:
    from icebatch_job.commit.window import RowWindow


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    truncated: bool


class PromptBuilder:
    """Builds the token ids of each row's prompt; shortens ``task.truncate_column`` when it is too long.

    The budget is ``max_model_len - max_tokens``: a prompt that fits always leaves room for a complete
    answer.
    """

    def __init__(self, task: TaskSpec, tokenizer: Any, max_model_len: int) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.budget = max_model_len - task.max_tokens
        if self.budget < MIN_PROMPT_TOKENS:
            raise ValueError(
                f"max_model_len {max_model_len} leaves {self.budget} tokens for the prompt after max_tokens "
                f"{task.max_tokens}; raise ICEBATCH_MAX_MODEL_LEN"
            )

        # The template rendered once around placeholders no row can contain (private-use characters
        # around a nonce); its own text is tokenized once, special tokens included.
        nonce = secrets.token_hex(8)
        marks = {f"\ue000{nonce}{i}\ue001": c for i, c in enumerate(task.input_columns)}
        split = re.compile("(" + "|".join(re.escape(m) for m in marks) + ")")
        rendered = tokenizer.apply_chat_template(
            task.messages({c: m for m, c in marks.items()}), tokenize=False, add_generation_prompt=True
        )
        if "\ue000" in split.sub("", rendered):
            raise ValueError(f"task {task.name}: user_template must use plain {{column}} fields (no format specs)")
        self.pieces: list[str | list[int]] = [
            marks[piece] if piece in marks else list(tokenizer(piece, add_special_tokens=False)["input_ids"])
            for piece in split.split(rendered)
            if piece
        ]

    def _ids(self, row: dict[str, Any]) -> list[int]:
        ids: list[int] = []
        for piece in self.pieces:
            if isinstance(piece, str):  # a row's value: text only, whatever it contains
                text = self.task.value_text(row.get(piece))
                ids += self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            else:
                ids += piece
        return ids

    def build(self, row: dict[str, Any]) -> Prompt:
        ids = self._ids(row)
        if len(ids) <= self.budget:
            return Prompt(ids, False)
        column = self.task.truncate_column
        if column is None:
            return Prompt(ids[: self.budget], True)  # no designated column: cut the end of the prompt
        text = self.task.value_text(row.get(column))
        text_ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        for _ in range(4):  # re-rendering can shift token boundaries; converge in a few steps
            excess = len(ids) - self.budget
            keep = max(0, len(text_ids) - excess - 8)
            text_ids = text_ids[:keep]
            shortened = self.tokenizer.decode(text_ids) + " [truncated]"
            ids = self._ids({**row, column: shortened})
            if len(ids) <= self.budget:
                return Prompt(ids, True)
        return Prompt(ids[: self.budget], True)


def _final_only() -> Any:
    """vLLM's ``RequestOutputKind.FINAL_ONLY`` in a process that has vLLM loaded (the engine's actor: its engine is
    built before any row reaches it); elsewhere the marker again, so that a Ray Data worker that only moves the row
    on (Ray Data LLM's preprocess map) does not import vLLM and torch to do it: ~0.5 GB and seconds of CPU each, in
    every such worker (ten of them took a minute of two cores' CPU from the engine's start-up)."""
    params = sys.modules.get("vllm.sampling_params")
    return FinalOnly() if params is None else params.RequestOutputKind.FINAL_ONLY


class FinalOnly:
    """vLLM's ``RequestOutputKind.FINAL_ONLY``, named without importing vLLM: the row carries it pickled, and it is the
    enum member again once a process that has vLLM (the engine's actor) unpickles it (``_final_only``).
    """

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_final_only, ())


class PromptStage:
    """Ray Data UDF (one tokenizer per worker): adds the columns vLLM's stage reads.

    With a ``window``, it first takes a permit per row (``icebatch_job.commit.window``). For the in-job
    ``engine`` (Ray Data LLM's vLLM stage), a row asks for its answer once, when it is finished (vLLM's
    ``FINAL_ONLY``), not at every step. In a shared job (``icebatch_job.shared``) each run has a prompt stage of its
    own, whose rows carry its ``member`` number through the engine back to the driver.
    """

    def __init__(
        self,
        task: TaskSpec,
        model_path: str,
        max_model_len: int,
        structured_output: bool,
        window: RowWindow | None = None,
        engine: bool = False,
        member: int | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        from icebatch_job.stages.model import tokenizer_path

        self.builder = PromptBuilder(task, AutoTokenizer.from_pretrained(tokenizer_path(model_path)), max_model_len)
        self.sampling = task.sampling.params()
        if structured_output:
            self.sampling["structured_outputs"] = {"json": task.output_schema_json}
        self.window = window
        self.member = member
        if engine:
            self.sampling["output_kind"] = FinalOnly()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        n = len(batch[self.builder.task.id_column])
        if self.window is not None and not self.window.acquire(n):
            n = 0  # the window was closed: its run failed (a shared job's others go on), and its rows go no further
        prompts, truncated, empty = [], [], []
        for i in range(n):
            row = {c: _py(batch[c][i]) for c in self.builder.task.input_columns}
            p = self.builder.build(row)
            prompts.append(p.token_ids)
            truncated.append(p.truncated)
            empty.append(self.builder.task.is_empty_input(row))
        columns = {
            SOURCE_FILE: [str(x) for x in batch[SOURCE_FILE][:n]],
            SOURCE_POS: [int(x) for x in batch[SOURCE_POS][:n]],
            SOURCE_HASH: [int(x) for x in batch[SOURCE_HASH][:n]],
            SOURCE_ID: [str(x) for x in batch[self.builder.task.id_column][:n]],
            TRUNCATED: truncated,
            EMPTY_INPUT: empty,
            TOKENIZED_PROMPT: prompts,
            SAMPLING_PARAMS: [dict(self.sampling) for _ in range(n)],  # one each: the engine pops from them
        }
        if self.member is not None:
            columns[MEMBER] = [self.member] * n
        return columns


def _py(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
