"""A tiny Llama built locally, for running the real engine on a machine without a GPU or a model hub.

Random weights (hidden 128, 2 layers, 4 heads, about 1.4 M parameters) and a byte-level BPE tokenizer
trained on generated tickets and verdict-shaped JSON. Its answers are nonsense but, with structured
output, schema-valid: exactly what is needed to exercise the pipeline, the ledger and the cost report.
Built in a few seconds, cached under ``$ICEBATCH_HOME/models/tiny-llama`` (``icebatch model tiny``).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

VOCAB_SIZE = 4096
MAX_POSITIONS = 8192
MARKER = "icebatch-tiny.json"
SPECIAL = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# BOS comes from the template, not from a tokenizer post-processor: Ray's tokenize stage and vLLM both
# tokenize with special tokens on, which would otherwise produce a double BOS.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _corpus(n: int = 3000) -> list[str]:
    from icebatch.core.task import load_task

    from icebatch_job.example.tickets import generate_tickets

    rng = random.Random(0)
    task = load_task()
    enums = {k: v.get("enum", ["text"]) for k, v in task.output_fields.items()}
    texts = [task.system_prompt]
    for t in generate_tickets(n, rng, hard_case_rate=0.1):
        texts.append(task.render_user(t))
        verdict = {k: rng.choice(v) for k, v in enums.items()}
        verdict["summary"] = (t["subject"] or "")[:80]
        texts.append(json.dumps(verdict, separators=(",", ":")))
    return texts


def build_tiny_model(target: Path, *, force: bool = False, seed: int = 0) -> Path:
    """Build the model and tokenizer into ``target`` (idempotent: an existing build is reused)."""
    if (target / MARKER).exists() and not force:
        return target
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL[3:],
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    model.save_pretrained(tmp, safe_serialization=True)
    model.generation_config.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "seed": seed}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    log.info("built the tiny model in %s", target)
    return target
