"""The 001 §8.1 KV formula: the §3 reference, public dense configs, windows, blocks, chips."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calctl.budget.kv import cached_tokens, kv_bytes, kv_bytes_per_token, kv_heads_per_chip
from calctl.budget.shape import ModelShape, shape_from_hf_config


def test_qwen3_30b_a3b_kv_is_the_001_reference(hf_shape: Callable[[str], ModelShape]) -> None:
    s = hf_shape("Qwen3-30B-A3B")
    assert (s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.hidden, s.context_limit) == (48, 32, 4, 128, 2048, 40960)
    # Qwen3 states head_dim explicitly: hidden / heads would give 64 and half the KV.
    assert s.hidden // s.n_heads == 64
    kv = kv_bytes(s, context=40960, sequences=1, kv_dtype="bf16")
    # 2 (K,V) x 48 layers x 4 KV heads x 128 head_dim x 40960 tokens x 1 sequence x 2 bytes
    assert kv == 2 * 48 * 4 * 128 * 40960 * 1 * 2 == 4_026_531_840
    assert f"{kv / 2**30:.3f}" == "3.750"  # 001 §3: "BF16 KV 3.750 GiB 合计"
    assert kv_bytes_per_token(s, "bf16") == 98_304  # 2 x 48 x 4 x 128 x 2


# Published numbers of public 1B-3B dense models; bytes per token at bf16 (2 bytes):
#   2 (K,V) x layers x kv_heads x head_dim x 2
DENSE = [
    # name,                  layers, kv_heads, head_dim, bytes/token
    ("Llama-3.2-1B", 16, 8, 64, 32_768),  # 2*16*8*64*2   = 32768
    ("Llama-3.2-3B", 28, 8, 128, 114_688),  # 2*28*8*128*2  = 114688
    ("Qwen2.5-1.5B-Instruct", 28, 2, 128, 28_672),  # 2*28*2*128*2  = 28672 (head_dim = 1536/12)
    ("Qwen2.5-3B-Instruct", 36, 2, 128, 36_864),  # 2*36*2*128*2  = 36864 (head_dim = 2048/16)
    ("gemma-2-2b", 26, 4, 256, 106_496),  # 2*26*4*256*2  = 106496 (explicit head_dim; 2304/8 = 288)
    ("SmolLM2-1.7B", 24, 32, 64, 196_608),  # 2*24*32*64*2  = 196608 (no GQA: 32 KV heads)
]


@pytest.mark.parametrize(("name", "layers", "kv_heads", "head_dim", "per_token"), DENSE)
def test_dense_configs_kv_bytes_per_token(
    hf_shape: Callable[[str], ModelShape], name: str, layers: int, kv_heads: int, head_dim: int, per_token: int
) -> None:
    s = hf_shape(name)
    assert (s.n_layers, s.n_kv_heads, s.head_dim) == (layers, kv_heads, head_dim)
    assert s.moe is None
    assert kv_bytes_per_token(s, "bf16") == per_token
    # Up to the shortest window (gemma-2: 4096) every layer holds every token: KV is linear.
    assert kv_bytes(s, context=4096, sequences=3, kv_dtype="bf16") == 4096 * 3 * per_token


def test_gemma2_even_layers_slide(hf_shape: Callable[[str], ModelShape]) -> None:
    s = hf_shape("gemma-2-2b")
    assert s.windows[:4] == (4096, None, 4096, None)
    assert sum(w is not None for w in s.windows) == 13
    assert "gemma2" in s.window_convention
    # 8192 tokens: 13 full layers hold 8192, 13 sliding layers hold 4096.
    # 2 x (13*8192 + 13*4096) x 4 heads x 256 x 2 bytes = 2 x 159744 x 2048 = 654,311,424
    assert kv_bytes(s, context=8192, sequences=1, kv_dtype="bf16") == 654_311_424
    # ... against 8192 x 106496 = 872,415,232 if every layer kept every token.
    assert kv_bytes_per_token(s, "bf16") * 8192 == 872_415_232


def test_qwen2_window_is_ignored_unless_use_sliding_window(
    hf_shape: Callable[[str], ModelShape], hf_config_doc: Callable[[str], dict[str, Any]]
) -> None:
    off = hf_shape("Qwen2.5-1.5B-Instruct")  # states sliding_window 32768 with use_sliding_window false
    assert off.windows == (None,) * 28
    assert "use_sliding_window is false" in off.window_convention

    doc = {**hf_config_doc("Qwen2.5-1.5B-Instruct"), "use_sliding_window": True, "sliding_window": 4096}
    on = shape_from_hf_config(doc)
    # Qwen2 convention: layers >= max_window_layers (21) slide.
    assert on.windows == (None,) * 21 + (4096,) * 7
    # 8192 tokens: 2 x (21*8192 + 7*4096) x 2 heads x 128 x 2 bytes = 2 x 200704 x 512 = 205,520,896
    assert kv_bytes(on, context=8192, sequences=1, kv_dtype="bf16") == 205_520_896


def test_explicit_layer_types_win(hf_config_doc: Callable[[str], dict[str, Any]]) -> None:
    doc = {
        **hf_config_doc("Llama-3.2-1B"),
        "sliding_window": 1024,
        "layer_types": ["sliding_attention", "full_attention"] * 8,
    }
    s = shape_from_hf_config(doc)
    assert s.windows == (1024, None) * 8
    assert s.window_convention.startswith("layer_types: 8 sliding_attention")


def test_mistral_style_window_applies_to_every_layer(hf_config_doc: Callable[[str], dict[str, Any]]) -> None:
    doc = {**hf_config_doc("Llama-3.2-1B"), "model_type": "mistral", "sliding_window": 4096}
    s = shape_from_hf_config(doc)
    assert s.windows == (4096,) * 16
    # Past the window the cache stops growing.
    assert kv_bytes(s, context=100_000, sequences=1, kv_dtype="bf16") == kv_bytes(
        s, context=4096, sequences=1, kv_dtype="bf16"
    )


def test_block_rounding_is_per_sequence_and_per_layer(hf_shape: Callable[[str], ModelShape]) -> None:
    s = hf_shape("Llama-3.2-1B")
    # 100 tokens in blocks of 16 occupy 7 blocks = 112 tokens, for each of 3 sequences.
    assert cached_tokens(100, None, 16) == 112
    assert kv_bytes(s, context=100, sequences=3, kv_dtype="bf16", block_tokens=16) == 112 * 3 * 32_768
    # A full block costs exactly its tokens.
    assert kv_bytes(s, context=96, sequences=1, kv_dtype="bf16", block_tokens=16) == 96 * 32_768
    # Windows round too: min(8192, 4096) = 4096 is already whole; 4000 in blocks of 64 -> 4032.
    assert cached_tokens(8192, 4000, 64) == 4032


@pytest.mark.parametrize(
    ("heads", "chips", "per_chip"), [(4, 1, 4), (4, 2, 2), (4, 3, 2), (1, 2, 1), (8, 8, 1), (2, 4, 1)]
)
def test_kv_heads_split_across_chips_by_ceiling(heads: int, chips: int, per_chip: int) -> None:
    assert kv_heads_per_chip(heads, chips) == per_chip


def test_kv_dtype_widths(hf_shape: Callable[[str], ModelShape]) -> None:
    s = hf_shape("Qwen3-30B-A3B")
    assert kv_bytes_per_token(s, "fp8") == 49_152  # 2 x 48 x 4 x 128 x 1
    assert kv_bytes_per_token(s, "int4") == 24_576  # 2 x 48 x 4 x 128 x 0.5
    assert kv_bytes(s, context=40960, sequences=1, kv_dtype="int4") == 4_026_531_840 // 4
    # On 2 chips each holds 2 of the 4 KV heads: half the reference.
    assert kv_bytes(s, context=40960, sequences=1, kv_dtype="bf16", kv_heads=kv_heads_per_chip(4, 2)) == 2_013_265_920
