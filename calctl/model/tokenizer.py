"""Deterministic byte-level BPE tokenizers for sample packages (HF ``tokenizers``).

Trained on a small built-in corpus so every sample package ships a real
``tokenizer.json`` that ``tokenizers.Tokenizer.from_file`` loads, with a ChatML
chat template in ``tokenizer_config.json``.
"""

from __future__ import annotations

import json

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
