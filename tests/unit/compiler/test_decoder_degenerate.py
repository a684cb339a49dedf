"""A hidden state float32 cannot normalise gives NaN logits, not all-zero ones (issue #55)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from calctl.model import decoder, quant
from calctl.model import native as native_module
from calctl.package.model import Architecture
from calctl.serving.engine.job_checks import logits_fault

MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
ARCH = Architecture(
    family="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96, vocab_size=200,
    context_limit=64, dtype="fp32", rope_style="half", tie_embeddings=False,
)  # fmt: skip


@pytest.mark.parametrize("native", [True, False])
def test_a_hidden_state_past_the_norms_float32_range_gives_nan_logits(native: bool) -> None:
    """Embeddings of 1e30 (as a garbage hidden state): the final norm's mean square overflows; the logits of that
    lane are NaN, which the engine's output check refuses, not the all-zero row 1 / sqrt(inf) made."""
    params: dict[str, object] = dict(decoder.init_params(ARCH, np.random.default_rng(9)))
    embed = np.asarray(params["embed"])
    embed[7] *= np.float32(1e30)
    if native:  # the layers' matrices as q8_0 blocks: every layer in the native decode call
        for name in [n for n in params if n.rsplit(".", 1)[-1] in MATRICES]:
            params[name] = quant.quantize(name, "q8_0", np.asarray(params[name]))
    w = decoder.prepare(params, ARCH, native=native)
    assert (w.native_stack is not None) == (native and native_module.kernels() is not None)
    caches = [decoder.KvCache.empty(ARCH, 16) for _ in range(2)]
    for c in caches:
        decoder.prefill(w, ARCH, np.array([1, 2, 3]), c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no numpy overflow warning on the way
        logits = decoder.decode_batch(w, ARCH, np.array([7, 5]), np.array([3, 3]), caches)
    assert np.all(np.isnan(logits[0])), logits[0][:8]
    assert np.all(np.isfinite(logits[1])) and np.ptp(logits[1]) > 0  # the other lane is untouched
    assert logits_fault(logits) == "non-finite logits"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = decoder.prefill(w, ARCH, np.array([1, 7]), decoder.KvCache.empty(ARCH, 16))
    assert np.all(np.isnan(first))


def test_the_bound_is_where_float32s_sum_of_squares_overflows() -> None:
    d = 576
    bound = np.sqrt(np.finfo(np.float32).max / d)  # 7.7e17
    w = np.ones(d, np.float32)
    below, above = np.full((1, d), bound * 0.9, np.float32), np.full((1, d), bound * 1.1, np.float32)
    np.testing.assert_allclose(decoder._final_norm(below, w, 1e-5), 1.0, rtol=1e-5)  # scale-invariant up to it
    assert np.all(np.isnan(decoder._final_norm(above, w, 1e-5)))
    ordinary = np.random.default_rng(1).standard_normal((3, d)).astype(np.float32) * 300
    np.testing.assert_array_equal(decoder._final_norm(ordinary, w, 1e-5), decoder._rms(ordinary, w, 1e-5))


@pytest.mark.parametrize(
    ("rows", "fault"),
    [
        ([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]], "degenerate logits (lane 0: every one of 3 equal to 0.0)"),
        ([[1.0, 2.0, 3.0], [-4.5, -4.5, -4.5]], "degenerate logits (lane 1: every one of 3 equal to -4.5)"),
        ([[1.0, np.nan, 3.0], [0.0, 0.0, 0.0]], "non-finite logits"),
        ([[1.0, np.inf, 3.0]], "non-finite logits"),
        ([[-np.inf, 0.0, 3.0]], "non-finite logits"),
        ([[1.0, 2.0, 3.0], [3.0, 2.0, 2.0]], None),
        ([[5.0], [5.0]], None),  # a vocabulary of one token: nothing to tell apart
        ([[3e38, -3e38, 0.0], [1.0, 1.0, 1.0]], "degenerate logits (lane 1: every one of 3 equal to 1.0)"),
        ([[3e38, -3e38, 0.0]], None),  # finite, though their spread is past float32's range
        (np.zeros((0, 4)), None),  # no active lanes
    ],
)
def test_the_engines_output_check_names_non_finite_and_degenerate_rows(rows: object, fault: str | None) -> None:
    assert logits_fault(np.asarray(rows, np.float32)) == fault


@pytest.mark.parametrize("native", [True, False])
def test_an_infinite_norm_weight_gives_nan_logits_and_no_runtime_warning(native: bool) -> None:
    """Issue 54: an inf in attn_norm (a resealed package) made numpy print "invalid value encountered in matmul"
    from decoder.py on run-golden's terminal; the NaN logits are the finding (golden, GOLD010), never a warning."""
    params: dict[str, object] = dict(decoder.init_params(ARCH, np.random.default_rng(3)))
    np.asarray(params["layers.0.attn_norm"])[:] = np.inf
    w = decoder.prepare(params, ARCH, native=native)
    cache = decoder.KvCache.empty(ARCH, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits = decoder.prefill(w, ARCH, np.array([1, 2, 3]), cache)
        step = decoder.decode_step(w, ARCH, 4, 3, cache)
    assert not np.all(np.isfinite(logits)) and not np.all(np.isfinite(step))
