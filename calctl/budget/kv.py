"""The KV-cache formula of 001 §8.1, with the corrections the report says it needs.

``KV_bytes = 2 (K,V) · n_layers · n_kv_heads · head_dim · context · sequences · bytes``
is the theoretical lower bound; the real value also depends on layout and
page/block rounding (001 §8.1, last paragraph). Here:

* GQA: ``n_kv_heads`` is the config's ``num_key_value_heads``, not the query heads;
* ``head_dim`` is the config's explicit value when present (``ModelShape``);
* a sliding-window layer caches ``min(context, window)`` tokens, not ``context``;
* each sequence's cached tokens per layer round up to whole blocks of
  ``block_tokens`` (the manifest's ``kv.block_tokens``), because a KV block
  belongs to exactly one sequence;
* with tensor parallelism the KV heads split across chips by ceiling division
  (4 heads on 3 chips is 2 per chip: a head is never split);
* element widths are in bits so int4 (half a byte) is exact.

This module only computes bytes. It does not decide what fits (``policy``) and
does not read files.
"""

from __future__ import annotations

from calctl.budget.shape import ModelShape
from calctl.budget.units import DTYPE_BITS, bits_to_bytes


def kv_heads_per_chip(n_kv_heads: int, chips: int) -> int:
    """KV heads one chip holds when the model is split over ``chips`` (ceiling division)."""
    if chips < 1:
        raise ValueError(f"chips must be >= 1, got {chips}")
    return -(-n_kv_heads // chips)


def round_up(tokens: int, block_tokens: int) -> int:
    """``tokens`` rounded up to whole KV blocks."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    return -(-tokens // block_tokens) * block_tokens


def cached_tokens(context: int, window: int | None, block_tokens: int = 1) -> int:
    """Tokens one layer caches for one sequence of ``context`` tokens, block-rounded."""
    held = context if window is None else min(context, window)
    return round_up(held, block_tokens)


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str, *, kv_heads: int | None = None) -> int:
    """Bytes one token adds to the cache with every layer at full attention, no rounding.

    This is the 001 §8.1 rate ``2 · layers · kv_heads · head_dim · bytes``. Sliding-window
    layers stop growing past their window, so for such models it is an upper bound.
    """
    heads = shape.n_kv_heads if kv_heads is None else kv_heads
    return bits_to_bytes(2 * shape.n_layers * heads * shape.head_dim * DTYPE_BITS[kv_dtype])


def kv_bytes(
    shape: ModelShape,
    *,
    context: int,
    sequences: int,
    kv_dtype: str,
    kv_heads: int | None = None,
    block_tokens: int = 1,
) -> int:
    """KV bytes for ``sequences`` active sequences of ``context`` tokens each (001 §8.1).

    ``kv_heads`` is the number of KV heads held where the bytes live (all of them for
    the whole model, ``kv_heads_per_chip`` for one chip).
    """
    if context < 0 or sequences < 0:
        raise ValueError(f"context and sequences must be >= 0, got {context}, {sequences}")
    heads = shape.n_kv_heads if kv_heads is None else kv_heads
    layer_tokens = sum(cached_tokens(context, w, block_tokens) for w in shape.windows)
    return bits_to_bytes(2 * layer_tokens * heads * shape.head_dim * sequences * DTYPE_BITS[kv_dtype])
