"""The one table of bounds on the architecture numbers a file a user was handed may declare.

A checkpoint's ``config.json``, a GGUF's metadata, a budget's ``--hf-config``
and a package manifest all state the same facts: layers, heads, head_dim,
widths, vocabulary, context. Every reader that meets one of these numbers checks
it here *before* the number costs anything (a loop per layer, a list per head
pair, an array per token), so the same fact has the same limit in ``validate``,
``import hf``, ``import gguf``, ``budget``, ``combine``, ``inspect``, ``serve``
and ``run-golden`` (issue 54). The manifest schema states the same maxima
(``calctl/schemas/calculet-package-v1.json``; a test keeps the two equal), and
docs/validate.md "Limits" lists every entry (a test keeps that complete).

The limits are far above any released model (figures in each ``why``) and far
below what a hostile file needs to cost gigabytes or hours. This module knows
no file format and raises nothing: readers turn :func:`over_limit`'s sentence
into their own error naming the file and field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """The largest value one architecture fact may take, and why that figure."""

    name: str  # the constant's name in this module (docs/validate.md quotes it)
    fact: str
    maximum: int
    why: str


MAX_LAYERS = Limit("MAX_LAYERS", "decoder layers", 1024, "Llama 3.1 405B has 126")
MAX_HEADS = Limit("MAX_HEADS", "attention heads (query or KV)", 1024, "Llama 3.1 405B has 128")
MAX_HEAD_DIM = Limit("MAX_HEAD_DIM", "head_dim", 1024, "released models use 64 to 256")
MAX_D_MODEL = Limit("MAX_D_MODEL", "hidden width (d_model)", 65536, "Llama 3.1 405B has 16,384")
MAX_D_FF = Limit("MAX_D_FF", "MLP width (d_ff)", 262144, "Llama 3.1 405B has 53,248")
MAX_VOCAB = Limit("MAX_VOCAB", "vocabulary entries (and so token ids)", 1 << 20, "Gemma 3 has 262,144")
MAX_CONTEXT = Limit("MAX_CONTEXT", "context positions", 1 << 24, "Llama 4 Scout states 10,485,760")
MAX_EXPERTS = Limit("MAX_EXPERTS", "MoE experts", 4096, "DeepSeek-V3 has 256 routed experts")
MAX_SEQUENCES = Limit("MAX_SEQUENCES", "KV sequences (lanes)", 1 << 20, "a board holds hundreds")
MAX_GGUF_KEYS = Limit("MAX_GGUF_KEYS", "GGUF metadata keys", 1024, "released GGUFs hold 25 to 60")
#: The absolute bound; a file's tensors must also be exactly those its family and ``block_count`` imply.
MAX_GGUF_TENSORS = Limit(
    "MAX_GGUF_TENSORS", "GGUF tensors", 16 * 1024 + 16, "at most 12 a layer and 4 more; Llama 3.1 405B has 1,138"
)
MAX_GGUF_ARRAY_ITEMS = Limit(
    "MAX_GGUF_ARRAY_ITEMS",
    "strings in a GGUF's metadata arrays, all keys together",
    1 << 21,
    "Llama 3 holds 408,403 (128,256 tokens, 280,147 merges)",
)
#: A ``tokenizer.json``'s ``model.merges`` (BPE): the tokenizers library spends about 0.5 KB and 3 µs a merge.
MAX_MERGES = Limit("MAX_MERGES", "BPE merges of a tokenizer", 1 << 20, "Llama 3 has 280,147, Qwen 2.5 151,387")
#: A ``tokenizer.json``'s ``added_tokens`` (each also a vocabulary entry, so within ``MAX_VOCAB`` too).
MAX_ADDED_TOKENS = Limit("MAX_ADDED_TOKENS", "added tokens of a tokenizer", 65536, "Llama 3 lists 256")
MAX_SHARDS = Limit("MAX_SHARDS", "weight shard files", 4096, "Llama 3.1 405B ships 191 safetensors shards")
#: Any other integer a config declares (a pattern, a step): bounded so no arithmetic on it runs away.
MAX_COUNT = Limit("MAX_COUNT", "any other declared count", 2**31 - 1, "an int32, as the C runtime holds it")

LIMITS: tuple[Limit, ...] = (
    MAX_LAYERS,
    MAX_HEADS,
    MAX_HEAD_DIM,
    MAX_D_MODEL,
    MAX_D_FF,
    MAX_VOCAB,
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_SEQUENCES,
    MAX_GGUF_KEYS,
    MAX_GGUF_TENSORS,
    MAX_GGUF_ARRAY_ITEMS,
    MAX_MERGES,
    MAX_ADDED_TOKENS,
    MAX_SHARDS,
    MAX_COUNT,
)

#: Field name -> its limit, for every spelling of a fact: Hugging Face ``config.json`` (also ``--hf-config``),
#: GGUF metadata (after the ``<arch>.`` prefix), and the manifest's ``architecture``/``tokenizer``/``kv``.
BY_FIELD: Mapping[str, Limit] = {
    # layers
    "num_hidden_layers": MAX_LAYERS,
    "block_count": MAX_LAYERS,
    "n_layers": MAX_LAYERS,
    "max_window_layers": MAX_LAYERS,
    "first_k_dense_replace": MAX_LAYERS,
    "decoder_sparse_step": MAX_LAYERS,
    "moe_layer_freq": MAX_LAYERS,
    "sliding_window_pattern": MAX_LAYERS,
    # heads
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "attention.head_count": MAX_HEADS,
    "attention.head_count_kv": MAX_HEADS,
    "n_heads": MAX_HEADS,
    "n_kv_heads": MAX_HEADS,
    # head_dim
    "head_dim": MAX_HEAD_DIM,
    "attention.key_length": MAX_HEAD_DIM,
    "attention.value_length": MAX_HEAD_DIM,
    # widths
    "hidden_size": MAX_D_MODEL,
    "embedding_length": MAX_D_MODEL,
    "d_model": MAX_D_MODEL,
    "intermediate_size": MAX_D_FF,
    "moe_intermediate_size": MAX_D_FF,
    "shared_expert_intermediate_size": MAX_D_FF,
    "feed_forward_length": MAX_D_FF,
    "d_ff": MAX_D_FF,
    # vocabulary and token ids
    "vocab_size": MAX_VOCAB,
    "bos_token_id": MAX_VOCAB,
    "eos_token_id": MAX_VOCAB,
    "pad_token_id": MAX_VOCAB,
    # context
    "max_position_embeddings": MAX_CONTEXT,
    "original_max_position_embeddings": MAX_CONTEXT,
    "context_length": MAX_CONTEXT,
    "context_limit": MAX_CONTEXT,
    "sliding_window": MAX_CONTEXT,
    "block_tokens": MAX_CONTEXT,
    # experts
    "num_experts": MAX_EXPERTS,
    "num_local_experts": MAX_EXPERTS,
    "n_routed_experts": MAX_EXPERTS,
    "num_experts_per_tok": MAX_EXPERTS,
    "n_shared_experts": MAX_EXPERTS,
    "expert_count": MAX_EXPERTS,
    "expert_used_count": MAX_EXPERTS,
    # lanes
    "max_sequences": MAX_SEQUENCES,
    # files
    "weight_shards": MAX_SHARDS,
}


def limit_of(field: str) -> Limit:
    """The limit of ``field`` (any spelling in :data:`BY_FIELD`), :data:`MAX_COUNT` for any other name."""
    return BY_FIELD.get(field, MAX_COUNT)


def over_limit(field: str, value: int) -> str | None:
    """None if ``value`` is within ``field``'s limit, else the sentence saying value, limit and why.

    Token ids are indices, so their limit is exclusive (an id of ``MAX_VOCAB`` is already past the table).
    """
    limit = limit_of(field)
    top = limit.maximum - 1 if field.endswith("_token_id") else limit.maximum
    if value <= top:
        return None
    return (
        f"{value} is over the limit of {top:,} {limit.fact} (calctl.limits.{limit.name}; {limit.why}); "
        "a file declaring more is refused before any work is done"
    )


@dataclass(frozen=True)
class Range:
    """The values a real-valued fact (RoPE base, scaling factors) may take: finite, ``minimum <= v <= maximum``."""

    name: str  # the constant's name in this module (docs/validate.md quotes it)
    fact: str
    minimum: float
    maximum: float
    why: str


ROPE_THETA = Range("ROPE_THETA", "RoPE base (rope_theta)", 1.0, 1e10, "released models use 10,000 to 50,000,000")
#: ``factor`` of linear/llama3 scaling and every per-pair divisor (``rope_freq_factors``): transformers requires
#: ``factor >= 1`` and every llama3 divisor lies between 1 and ``factor``.
ROPE_FACTOR = Range(
    "ROPE_FACTOR", "RoPE scaling factor (factor, rope_freq_factors)", 1.0, 1024.0, "Llama 3.1 uses 8, Llama 4 16"
)
ROPE_FREQ_FACTOR = Range(
    "ROPE_FREQ_FACTOR", "llama3 low_freq_factor / high_freq_factor", 1e-3, 1024.0, "Llama 3.x uses 1 and 4"
)

#: The epsilon under the square root of RMSNorm/LayerNorm: 1e308 makes every normalised activation zero, 0 or a
#: negative value divides by zero on a silent row. Figures a config carries that calctl's decoder does not use
#: (attention multipliers, logit softcapping, initializer ranges) are not read, so not ranged.
NORM_EPS = Range(
    "NORM_EPS", "normalisation epsilon (rms_norm_eps)", 1e-12, 0.1, "released models use 1e-6 to 1e-5, BERT 1e-12"
)

RANGES: tuple[Range, ...] = (ROPE_THETA, ROPE_FACTOR, ROPE_FREQ_FACTOR, NORM_EPS)

#: Field name -> its range, for every spelling: Hugging Face (``rope_scaling``/``rope_parameters`` keys,
#: ``rms_norm_eps``), GGUF (``rope.freq_base``, ``rope.scaling.factor``, ``attention.layer_norm_rms_epsilon``) and
#: the manifest's ``rope_theta``/``norm_eps``.
RANGE_BY_FIELD: Mapping[str, Range] = {
    "rope_theta": ROPE_THETA,
    "rope.freq_base": ROPE_THETA,
    "factor": ROPE_FACTOR,
    "rope.scaling.factor": ROPE_FACTOR,
    "rope_freq_factors": ROPE_FACTOR,
    "low_freq_factor": ROPE_FREQ_FACTOR,
    "high_freq_factor": ROPE_FREQ_FACTOR,
    "rms_norm_eps": NORM_EPS,
    "layer_norm_eps": NORM_EPS,
    "layer_norm_epsilon": NORM_EPS,
    "norm_epsilon": NORM_EPS,
    "attention.layer_norm_rms_epsilon": NORM_EPS,
    "attention.layer_norm_epsilon": NORM_EPS,
    "norm_eps": NORM_EPS,
}


def out_of_range(field: str, value: object) -> str | None:
    """None if ``value`` is a finite number within ``field``'s range (:data:`RANGE_BY_FIELD`), else the sentence
    saying what was found and the range. A bool is not a number here (Python's ``True == 1``), nor is a string."""
    r = RANGE_BY_FIELD[field]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number, found {value!r} ({type(value).__name__})"
    if (isinstance(value, float) and not math.isfinite(value)) or not r.minimum <= value <= r.maximum:
        return (
            f"{value!r} is outside {r.minimum:g}..{r.maximum:g}, the range of a {r.fact} "
            f"(calctl.limits.{r.name}; {r.why})"
        )
    return None
