"""What a run's tokens would have cost at the batch APIs a user would otherwise pick, beside what the GPU cost.

OpenAI's Batch API, Anthropic's Message Batches and Amazon Bedrock's batch inference all charge 50 % of their list
price per token. The report prices the run's input and output tokens at each (``ICEBATCH_BATCH_API_PRICES``:
a dated default list of small models fit for labelling, or your own, or ``off``) and says whether the GPU run
was the cheaper way. The figures are per million tokens, in USD, as the providers listed them on ``AS_OF``;
tokens are counted by the run's own tokenizer, which is not theirs (a rough comparison, within tens of %).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from icebatch.core.costs.money import usd

AS_OF = "2026-07"
DEFAULT_SPEC = (
    "openai-batch:gpt-4o-mini=0.075/0.30;"
    "anthropic-batch:claude-3-5-haiku=0.40/2.00;"
    "bedrock-batch:llama3-1-8b-instruct=0.11/0.11"
)
_NAME = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}"
_PRICE = r"(?:0|[1-9][0-9]{0,3})(?:\.[0-9]{1,6})?"
_ENTRY = re.compile(rf"({_NAME})=({_PRICE})/({_PRICE})")


@dataclass(frozen=True)
class BatchPrice:
    name: str  # provider:model
    input_usd_per_1m: float
    output_usd_per_1m: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_usd_per_1m + output_tokens * self.output_usd_per_1m) / 1e6


def parse_prices(spec: str) -> tuple[BatchPrice, ...]:
    """``name=input/output`` per million tokens, ``;``-separated (at most 10), or ``off`` (none). Raises
    ValueError naming the entry that is not one."""
    if spec == "off":
        return ()
    entries = spec.split(";")
    if len(entries) > 10:
        raise ValueError(f"{len(entries)} batch API prices: give at most 10")
    prices = []
    for entry in entries:
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise ValueError(f"{entry[:80]!r} is not `provider:model=<input $/1M>/<output $/1M>` (or give `off`)")
        prices.append(BatchPrice(match[1], float(match[2]), float(match[3])))
    return tuple(prices)


def comparison(prices: tuple[BatchPrice, ...], input_tokens: int, output_tokens: int, gpu_usd: float) -> list[str]:
    """One line per price: what the tokens cost there, and how the GPU run compares."""
    lines = []
    for p in prices:
        there = p.cost(input_tokens, output_tokens)
        if there <= 0 or gpu_usd <= 0:
            verdict = ""
        elif gpu_usd < there:
            verdict = f": the GPU run was {there / gpu_usd:.1f}x cheaper"
        else:
            verdict = f": {gpu_usd / there:.1f}x cheaper than the GPU run"
        lines.append(f"{p.name} {usd(there)}{verdict}")
    return lines
