"""Tokens per row under the default task, and what they cost at the seed's measured throughput.

The seed asked for free-text reasoning (about 322 output tokens per ticket) and measured 2,776 output
tokens/s on its GPU at $2.24208/h ($0.072 per 1k tickets). icebatch's default task answers with one
compact JSON object under structured output (no whitespace), so the output is bounded by its schema:

- ``typical``: realistic verdicts for generated tickets (summaries of 40-90 characters), tokenized;
- ``bound``: the schema's worst case (longest enum values, a 120-character summary at one token per
  character), capped by the task's ``max_tokens``;
- ``tiny model``: what the random-weight CPU model emits (it always fills the summary to its cap), read
  from the latest pipeline benchmark when there is one.

Token counts use the tiny model's tokenizer (byte-level BPE, 4,096 tokens, trained on tickets); large
models' tokenizers (128k vocabularies) need fewer tokens for the same text, so these are upper-ish.

    python -m bench.tokens_per_row
"""

from __future__ import annotations

import json
import random

from bench.common import RESULTS, table, write

SEED_TOKENS_PER_TICKET = 322
SEED_OUTPUT_TOKENS_PER_S = 2776
SEED_HOURLY_RATE = 2.24208
SEED_USD_PER_1K = 0.072


def usd_per_1k(tokens_per_row: float) -> float:
    return tokens_per_row * 1000 / SEED_OUTPUT_TOKENS_PER_S / 3600 * SEED_HOURLY_RATE


def main() -> None:
    from icebatch.core.settings import Settings
    from icebatch.core.task import load_task
    from icebatch_job.example.tickets import SCENARIOS, generate_tickets
    from icebatch_job.stages.model import resolve_model
    from transformers import AutoTokenizer

    task = load_task()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(Settings.from_env()))
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    dump = lambda verdict: json.dumps(verdict, separators=(",", ":"))  # noqa: E731

    by_subject = {s: sc.category for sc in SCENARIOS for s in sc.subjects}
    rng = random.Random(0)
    typical = []
    for t in generate_tickets(1000, rng):
        summary = f"{t['customer_tier'].title()} customer via {t['channel']}: {t['subject']}"
        if rng.random() < 0.5:
            summary += "; asks for a fix today"
        verdict = {
            "sentiment": rng.choice(["negative", "neutral", "positive"]),
            "urgency": rng.choice(["low", "medium", "high", "critical"]),
            "category": by_subject.get(t["subject"], "other"),
            "summary": summary[:120],
        }
        assert task.parse(dump(verdict))[0] is not None
        typical.append(count(dump(verdict)))
    longest = {k: max(v["enum"], key=len) for k, v in task.output_fields.items() if "enum" in v}
    skeleton = count(dump({**longest, "summary": ""}))
    max_summary = task.output_fields["summary"].get("maxLength", 120)
    bound = min(task.max_tokens, skeleton + max_summary)

    tiny = None
    latest = RESULTS / "pipeline_vs_bare-latest.json"
    if latest.exists():
        e2e = json.loads(latest.read_text())
        tiny = e2e["median"]["job"]["output_tokens"] / e2e["rows"]

    mean_typical = sum(typical) / len(typical)
    rows = [("output tokens per ticket", "tokens", "$ per 1k tickets at 2,776 tok/s, $2.24208/h", "vs seed")]
    entries = {
        "seed (free-text reasoning)": SEED_TOKENS_PER_TICKET,
        "icebatch typical verdict": mean_typical,
        "icebatch schema bound": bound,
    }
    if tiny is not None:
        entries["tiny random model (fills the summary)"] = tiny
    for name, tokens in entries.items():
        rows.append((name, f"{tokens:.1f}", f"${usd_per_1k(tokens):.4f}", f"{tokens / SEED_TOKENS_PER_TICKET:.2f}x"))
    result = {
        "typical_tokens": {"mean": mean_typical, "min": min(typical), "max": max(typical)},
        "schema_skeleton_tokens": skeleton,
        "schema_bound_tokens": bound,
        "max_tokens": task.max_tokens,
        "tiny_model_tokens": tiny,
        "usd_per_1k": {k: usd_per_1k(v) for k, v in entries.items()},
        "seed": {
            "tokens": SEED_TOKENS_PER_TICKET,
            "output_tok_per_s": SEED_OUTPUT_TOKENS_PER_S,
            "hourly_rate": SEED_HOURLY_RATE,
            "usd_per_1k_reported": SEED_USD_PER_1K,
        },
        "check_seed_formula": usd_per_1k(SEED_TOKENS_PER_TICKET),
    }
    path = write("tokens_per_row", result)
    print(table(rows))
    seed_usd = usd_per_1k(SEED_TOKENS_PER_TICKET)
    print(
        f"\n(the seed's own figure, {SEED_TOKENS_PER_TICKET} tokens at these rates: ${seed_usd:.4f} "
        f"per 1k, as it reported ${SEED_USD_PER_1K})\nwritten: {path}"
    )


if __name__ == "__main__":
    main()
