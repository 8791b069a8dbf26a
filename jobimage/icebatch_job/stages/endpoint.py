"""Endpoint mode: the same pipeline, answered by an existing OpenAI-compatible server.

Each row becomes one ``POST {ICEBATCH_ENDPOINT_URL}/chat/completions`` with the task's messages,
sampling and ``response_format`` (``json_schema``, strict). At most ``ICEBATCH_ENDPOINT_CONCURRENCY``
requests are in flight; 408/409/429/5xx answers and connection errors are retried with exponential
backoff and jitter up to ``ICEBATCH_ENDPOINT_MAX_RETRIES`` times, after which the row is kept as an
``inference_error`` (never dropped, never retried forever). Token counts come from the response's
``usage``; an answer whose text is not text or whose counts are not counts is an ``inference_error``
too (``read_completion``).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import TYPE_CHECKING, Any

from icebatch.core.settings import Settings
from icebatch.core.task import TaskSpec
from icebatch.core.untrusted import summarize

from icebatch_job.columns import (
    EMPTY_INPUT,
    GENERATED_TEXT,
    INFERENCE_ERROR,
    MEMBER,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    SMALL_CPU,
    SOURCE_FILE,
    SOURCE_HASH,
    SOURCE_ID,
    SOURCE_POS,
    TIME_TAKEN_LLM,
    TRUNCATED,
)

if TYPE_CHECKING:
    import ray.data

    from icebatch_job.commit.window import RowWindow
    from icebatch_job.stages.inputs import RunSource

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
CHARS_PER_TOKEN_FLOOR = 2  # conservative when no tokenizer is at hand (CJK text is ~1-2 chars/token)


# Chat-template markup (``<|system|>``, ``</s>``, ``[INST]``...): an endpoint tokenizes the rendered chat
# with special tokens parsed, so a row's value holding them could forge a turn. A word joiner (U+2060)
# inside each keeps the text readable and makes it no special token. (The in-job engine tokenizes
# values with special tokens split: exact; see icebatch_job.stages.prompts.)
MARKUP = re.compile(r"<\||\|>|</?s>|\[/?INST\]|<</?SYS>>")


def defuse_markup(text: str) -> str:
    return MARKUP.sub(lambda m: m.group(0)[0] + "\u2060" + m.group(0)[1:], text)


def request_body(task: TaskSpec, row: dict[str, Any], model: str, structured: bool) -> dict[str, Any]:
    row = {k: defuse_markup(v) if isinstance(v, str) else v for k, v in row.items()}
    body: dict[str, Any] = {"model": model, "messages": task.messages(row), **task.sampling.params()}
    if structured:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": task.name.replace("-", "_"),
                "schema": task.answer_schema,
                "strict": True,
            },
        }
    return body


def truncate_by_chars(task: TaskSpec, row: dict[str, Any], max_model_len: int) -> tuple[dict[str, Any], bool]:
    """Shorten the truncate column so the prompt surely fits, without the endpoint's tokenizer."""
    column = task.truncate_column
    budget_chars = (max_model_len - task.max_tokens) * CHARS_PER_TOKEN_FLOOR
    fixed = len(task.system_prompt) + len(task.render_user({**row, column: ""})) if column else 0
    text = row.get(column) if column else None
    if not column or not isinstance(text, str) or fixed + len(text) <= budget_chars:
        return row, False
    keep = max(0, budget_chars - fixed - 16)
    return {**row, column: text[:keep] + " [truncated]"}, True


class EndpointStage:
    """Ray Data UDF: rows -> engine-shaped outputs from an OpenAI-compatible endpoint.

    With a ``window``, it first takes a permit per row (``icebatch_job.commit.window``). In a shared job each run has
    a stage of its own, whose rows carry its ``member`` number back to the driver (``icebatch_job.shared``).
    """

    def __init__(
        self, task: TaskSpec, settings: Settings, window: RowWindow | None = None, member: int | None = None
    ) -> None:
        self.task = task
        self.window = window
        self.member = member
        self.url = (settings.engine.endpoint_url or "").rstrip("/") + "/chat/completions"
        self.model = settings.engine.endpoint_model or "default"
        self.structured = settings.engine.structured_output
        self.max_model_len = settings.engine.max_model_len
        self.concurrency = settings.engine.endpoint_concurrency
        self.max_retries = settings.engine.endpoint_max_retries
        self.base_wait = 0.5

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        n = len(batch[self.task.id_column])
        if self.window is not None and not self.window.acquire(n):
            n = 0  # the window was closed: its run failed (a shared job's others go on), and its rows go no further
        rows = [{c: _py(batch[c][i]) for c in (self.task.id_column, *self.task.input_columns)} for i in range(n)]
        results = asyncio.run(self._all(rows))
        out: dict[str, list[Any]] = {
            SOURCE_FILE: list(batch[SOURCE_FILE][:n]),
            SOURCE_POS: list(batch[SOURCE_POS][:n]),
            SOURCE_HASH: list(batch[SOURCE_HASH][:n]),
            SOURCE_ID: [str(r[self.task.id_column]) for r in rows],
            TRUNCATED: [],
            EMPTY_INPUT: [self.task.is_empty_input(r) for r in rows],
            GENERATED_TEXT: [],
            NUM_INPUT_TOKENS: [],
            NUM_GENERATED_TOKENS: [],
            TIME_TAKEN_LLM: [],
            INFERENCE_ERROR: [],
        }
        for res in results:
            for k, v in res.items():
                out[k].append(v)
        if self.member is not None:
            out[MEMBER] = [self.member] * n
        return out

    async def _all(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import aiohttp

        gate = asyncio.Semaphore(self.concurrency)
        timeout = aiohttp.ClientTimeout(total=300, connect=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return await asyncio.gather(*(self._one(session, gate, r) for r in rows))

    async def _one(self, session: Any, gate: asyncio.Semaphore, row: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        prompt_row, truncated = truncate_by_chars(self.task, row, self.max_model_len)
        body = json.dumps(request_body(self.task, prompt_row, self.model, self.structured))
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.base_wait * 2 ** (attempt - 1) * (0.5 + random.random()))
            async with gate:
                t = time.perf_counter()
                try:
                    async with session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as r:
                        payload = await r.text()
                        elapsed = time.perf_counter() - t
                        if r.status in RETRYABLE_STATUS:
                            last_error = f"HTTP {r.status}: {payload[:300]}"
                            continue
                        if r.status != 200:
                            return _error(f"HTTP {r.status}: {payload[:500]}", truncated)
                except (TimeoutError, aiohttp.ClientError) as e:
                    last_error = f"{type(e).__name__}: {e}"
                    continue
            try:
                text, prompt_tokens, completion_tokens = read_completion(payload)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                return _error(f"unexpected response ({type(e).__name__}: {str(e)[:100]}): {payload[:300]}", truncated)
            return {
                TRUNCATED: truncated,
                GENERATED_TEXT: text,
                NUM_INPUT_TOKENS: prompt_tokens,
                NUM_GENERATED_TOKENS: completion_tokens,
                TIME_TAKEN_LLM: elapsed,
                INFERENCE_ERROR: "",
            }
        return _error(f"gave up after {self.max_retries + 1} attempts: {last_error}", truncated)


MAX_TOKEN_COUNT = 2**31 - 1  # the results table's token columns are 32-bit integers


def read_completion(payload: str) -> tuple[str, int, int]:
    """The answer's text and its prompt and completion token counts, from a chat completion response.

    The server is not trusted: text must be text (null: no answer) and counts whole numbers that fit the
    results (missing: 0, as servers without ``usage`` answer); anything else raises, and the row is kept
    as an ``inference_error`` instead of landing a number or an object where text or a count belongs.
    """
    data = json.loads(payload)
    content = data["choices"][0]["message"]["content"]
    if content is not None and not isinstance(content, str):
        raise TypeError(f"message.content is {type(content).__name__}, not text")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise TypeError(f"usage is {type(usage).__name__}, not an object")
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_TOKEN_COUNT):
            raise ValueError(f"usage.{key} is {summarize(value, 40)}, not a token count")
        counts.append(value or 0)
    return content or "", counts[0], counts[1]


def _error(message: str, truncated: bool) -> dict[str, Any]:
    return {
        TRUNCATED: truncated,
        GENERATED_TEXT: "",
        NUM_INPUT_TOKENS: 0,
        NUM_GENERATED_TOKENS: 0,
        TIME_TAKEN_LLM: 0.0,
        INFERENCE_ERROR: message,
    }


def _py(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def endpoint_batch_size(settings: Settings) -> int:
    """Rows per request batch: enough to keep ``endpoint_concurrency`` requests going."""
    return max(settings.engine.batch_size, settings.engine.endpoint_concurrency * 4)


def build_endpoint_pipeline(sources: list[RunSource], settings: Settings) -> ray.data.Dataset:
    """source rows -> engine-shaped outputs from the endpoint (one stage per run; the driver parses them)."""
    import ray.data

    answered = [
        source.dataset.map_batches(
            EndpointStage,
            fn_constructor_kwargs={
                "task": source.task,
                "settings": settings,
                "window": source.window,
                "member": source.member,
            },
            batch_size=endpoint_batch_size(settings),
            compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=SMALL_CPU,
        )
        for source in sources
    ]
    return answered[0].union(*answered[1:]) if len(answered) > 1 else answered[0]
