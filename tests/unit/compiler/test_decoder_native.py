"""The native fp16 GEMV and the decode path that uses it agree with numpy on the same stored weights."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from calctl.model import decoder, native
from calctl.package.model import Architecture

ARCH = Architecture(
    family="qwen3", n_layers=2, d_model=72, n_heads=6, n_kv_heads=2, head_dim=20, d_ff=100, vocab_size=301,
    context_limit=64, dtype="fp16", rope_style="half", qk_norm=True, tie_embeddings=False,
)  # fmt: skip


@pytest.fixture
def gemv() -> native.Gemv:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc): the native GEMV cannot be built here; numpy is used instead")
    fn = native.gemv_f16()
    assert fn is not None, native.status()  # a compiler is present: the build must work
    return fn


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 7), (64, 576), (1537, 96), (2, 33)])
def test_gemv_matches_numpy(gemv: native.Gemv, rows: int, cols: int) -> None:
    rng = np.random.default_rng(rows * cols)
    w = rng.standard_normal((rows, cols)).astype(np.float16)
    x = rng.standard_normal(cols).astype(np.float32)
    y = np.full(rows, np.nan, np.float32)
    gemv(w, x, y)
    np.testing.assert_allclose(y, w.astype(np.float64) @ x.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_fp16_decode_uses_native_and_agrees_with_numpy(gemv: native.Gemv) -> None:
    params = {k: v.astype(np.float16) for k, v in decoder.init_params(ARCH, np.random.default_rng(0)).items()}
    fast, slow = decoder.prepare(params, ARCH), decoder.prepare(params, ARCH, native=False)
    assert fast.native and not slow.native
    caches = [decoder.KvCache.empty(ARCH, 32) for _ in range(2)]
    prompt = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    outs = [decoder.prefill(w, ARCH, prompt, c) for w, c in zip((fast, slow), caches, strict=True)]
    for step in range(6):
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        tok = int(np.argmax(outs[1]))
        outs = [decoder.decode_step(w, ARCH, tok, c.length, c) for w, c in zip((fast, slow), caches, strict=True)]
    ref = decoder.reference_logits({k: v.astype(np.float32) for k, v in params.items()}, ARCH, prompt, last_only=True)
    np.testing.assert_allclose(decoder.prefill(fast, ARCH, prompt, decoder.KvCache.empty(ARCH, 32)), ref[0], atol=1e-4)


def test_fp32_weights_never_take_the_fp16_path() -> None:
    params = decoder.init_params(ARCH, np.random.default_rng(1))
    assert not decoder.prepare(params, ARCH).native  # rounding fp32 weights to fp16 would change the model
