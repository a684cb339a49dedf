"""Deterministic byte-level BPE tokenizers for sample packages (HF ``tokenizers``).

Trained on a small built-in corpus so every sample package ships a real
``tokenizer.json`` that ``tokenizers.Tokenizer.from_file`` loads, with a ChatML
chat template in ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = """\
A Calculet board is one PCIe device with two chips, and each chip has two CalCores.
The runtime keeps one current calbin per device, so configure is global to the board.
Model A lives on chip zero and model B lives on chip one; each runs its own prefill and decode.
Prefill reads the whole prompt and writes the key and value cache; decode adds one token at a time.
The scheduler admits a request only when the budget for sequences, tokens and waiting work allows it.
Weighted fair queuing charges each tenant for prompt tokens and for the output it asked for.
A sequence keeps its generation; a completion from an old generation is dropped, never delivered.
Bring-up starts with static validation: hashes, signatures, chip masks, ELF headers and the memory plan.
Golden runs compare logits within a tolerance and the greedy tokens exactly.
Warm-up measures latency percentiles before the model is declared ready.
The combined package places four graphs on two chips with no section crossing from one chip to the other.
Overlap ratio is one minus joint time over serial time; efficiency compares joint throughput with isolation.
A soak repeats load and unload, checks that memory returns to its baseline and that counters close.
Hello, how are you today? I am fine, thank you. What is the weather like in the lab?
The quick brown fox jumps over the lazy dog while the engineer reads the trace.
Numbers such as 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 4096 appear in budgets.
"""


def train(vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with exactly ``vocab_size`` entries (raises if the corpus is too small)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        min_frequency=1,
    )
    lines = CORPUS.splitlines()
    tok.train_from_iterator(lines * 4, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"tokenizer trained to {tok.get_vocab_size()} entries, wanted {vocab_size}")
    return tok


def to_json(tok: Tokenizer) -> bytes:
    """Canonical serialisation (sorted keys) so regenerated packages are byte-identical."""
    return (json.dumps(json.loads(tok.to_str()), indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def tokenizer_config(model_max_length: int) -> bytes:
    cfg = {
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    return (json.dumps(cfg, indent=1, sort_keys=True) + "\n").encode("utf-8")


def produced_ids(tok: Tokenizer) -> Iterator[tuple[int, str]]:
    """Every ``(id, where)`` a loaded tokenizer can emit: its vocabulary and added (special) tokens, and the ids
    its post-processor inserts (TemplateProcessing ``special_tokens``, Bert/Roberta ``cls``/``sep``).

    A BPE merge's result is a vocabulary entry (``tokenizers`` refuses a merge whose result it lacks), so the
    vocabulary covers merges. Issue 54: a check by count (``get_vocab_size``) let one id of 1,000,000 through.
    """
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        yield int(i), f"token {text!r}"
    processor = tok.post_processor
    if processor is not None:
        yield from _processor_ids(json.loads(processor.__getstate__()), "post_processor")


def _processor_ids(node: Any, where: str) -> Iterator[tuple[int, str]]:
    """Every id in a serialised post-processor, however deeply its Sequences nest (a walk with its own stack:
    no level is skipped, and no recursion limit is reached)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key == "ids" and isinstance(value, list):
                yield from ((int(v), f"{where} special token") for v in value if isinstance(v, int))
            elif key in ("cls", "sep") and isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
                yield int(value[1]), f"{where} {key} {value[0]!r}"
            else:
                stack.append(value)


def ids_outside(tok: Tokenizer, bound: int, *, shown: int = 3) -> tuple[int, list[str]]:
    """How many ids ``tok`` can produce that are not in ``[0, bound)``, and the first ``shown`` of them named."""
    bad = [(i, where) for i, where in produced_ids(tok) if not 0 <= i < bound]
    bad.sort()
    return len(bad), [f"id {i} ({where})" for i, where in bad[-shown:][::-1]]
