"""Quantised weights (q4_0, q4_1, q8_0) kept as shipped: the blocks, the native kernel, the decoder, the import."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from calctl.model import decoder, native, quant
from calctl.package.model import Architecture
from tests.conftest import TEST_KEY, Cli

gguf = pytest.importorskip("gguf")

QTYPES = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q8_0": "Q8_0"}
ARCH = Architecture(
    family="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96, vocab_size=200,
    context_limit=64, dtype="q4_1", rope_style="half", tie_embeddings=True,
)  # fmt: skip
MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@pytest.fixture
def kernels() -> native.Kernels:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc): the native kernels cannot be built here; numpy is used instead")
    k = native.kernels()
    assert k is not None, native.status()  # a compiler is present: the build must work
    return k


@pytest.mark.parametrize("dtype", sorted(QTYPES))
def test_blocks_are_ggmls_and_dequantise_like_gguf(dtype: str) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 40)).astype(np.float32)  # manifest [in, out]: stored as 40 rows of 3 blocks
    q = quant.quantize("layers.0.wq", dtype, w)
    qt = gguf.GGMLQuantizationType[QTYPES[dtype]]
    want = gguf.quants.dequantize(q.data, qt).reshape(40, 96)
    np.testing.assert_array_equal(q.dequantize_rows(), want)
    np.testing.assert_array_equal(np.asarray(q, dtype=np.float32), want.T)
    assert q.nbytes == 40 * 3 * quant.BLOCK_BYTES[dtype]
    assert np.abs(q.dequantize() - w).max() < (0.02 if dtype == "q8_0" else 0.6)


def test_a_row_that_is_not_whole_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of the 32-weight block"):
        quant.quantize("layers.0.wq", "q4_0", np.zeros((40, 8), np.float32))


@pytest.mark.parametrize("dtype", ["fp16", *sorted(QTYPES)])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 32, 37])
def test_native_gemm_equals_the_dequantised_matrix(kernels: native.Kernels, dtype: str, n: int) -> None:
    rng = np.random.default_rng(n)
    rows, cols = 37, 160
    w = rng.standard_normal((cols, rows)).astype(np.float32)
    if dtype == "fp16":
        data, ref = np.ascontiguousarray(w.T.astype(np.float16)), w.astype(np.float16).astype(np.float64)
    else:
        q = quant.quantize("layers.0.wq", dtype, w)
        data, ref = q.data, q.dequantize().astype(np.float64)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    y = np.full((n, rows), np.nan, np.float32)
    kernels.gemm(dtype, data, rows, cols, x, y)
    np.testing.assert_allclose(y, x.astype(np.float64) @ ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", sorted(QTYPES))
@pytest.mark.parametrize("n", [1, 2])
def test_the_integer_decode_path_is_as_exact_as_float32(kernels: native.Kernels, dtype: str, n: int) -> None:
    """One or two tokens take the 16-bit-parts path: against the float64 product of the dequantised matrix it
    errs within 8 float32 epsilons of sum(|x| |w|), as float32 summation does. Rounding the activations once to
    16 bits (the high parts alone) breaks this bound on every dtype here."""
    rng = np.random.default_rng(7)
    rows, cols = 64, 1536
    q = quant.quantize("layers.0.w_down", dtype, rng.standard_normal((cols, rows)).astype(np.float32))
    ref = q.dequantize().astype(np.float64)
    x = (rng.standard_normal((n, cols)) * np.logspace(-3, 3, cols)).astype(np.float32)  # blocks of any scale
    y = np.empty((n, rows), np.float32)
    kernels.gemm(dtype, q.data, rows, cols, x, y)
    want = x.astype(np.float64) @ ref
    bound = 8 * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(ref))
    assert np.all(np.abs(y - want) <= bound), float(np.max(np.abs(y - want) / bound))


@pytest.mark.parametrize("dtype", sorted(QTYPES))
def test_a_nan_or_infinite_activation_reaches_the_outputs_on_the_integer_path(
    kernels: native.Kernels, dtype: str
) -> None:
    rng = np.random.default_rng(3)
    rows, cols = 16, 64
    q = quant.quantize("layers.0.wq", dtype, rng.standard_normal((cols, rows)).astype(np.float32))
    for bad in (np.nan, np.inf):
        x = rng.standard_normal((1, cols)).astype(np.float32)
        x[0, 40] = bad
        y = np.zeros((1, rows), np.float32)
        kernels.gemm(dtype, q.data, rows, cols, x, y)
        assert np.all(~np.isfinite(y)), (bad, y)


def _stored(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stored rows of a random ``[cols, rows]`` matrix in ``dtype`` and the float64 matrix they hold."""
    w = rng.standard_normal((cols, rows)).astype(np.float32)
    if dtype == "fp16":
        return np.ascontiguousarray(w.T.astype(np.float16)), w.astype(np.float16).astype(np.float64)
    q = quant.quantize("layers.0.wq", dtype, w)
    return q.data, q.dequantize().astype(np.float64)


def _at_offset(a: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous copy of ``a`` starting ``offset`` bytes past a 64-byte line (0: on the line)."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    out = buf[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == offset
    return out


#: Large enough that the kernel splits the rows over threads (2M multiply-adds per eight tokens) and takes its
#: many-token path from 16 tokens on; rows that are not a multiple of the 16-row chunk or 8-row tile, odd fp16 cols.
SPLIT_SHAPES = {"fp16": (2705, 97), "q4_0": (1031, 288), "q4_1": (1031, 288), "q8_0": (1031, 288)}


@pytest.mark.parametrize("dtype", ["fp16", *sorted(QTYPES)])
def test_a_batched_gemm_equals_one_gemv_per_lane_on_any_thread_count(kernels: native.Kernels, dtype: str) -> None:
    rng = np.random.default_rng(7)
    rows, cols = SPLIT_SHAPES[dtype]
    data, ref = _stored(dtype, rows, cols, rng)
    for n, offset in [(n, 0) for n in (1, 5, 8, 9, 16, 17, 40)] + [(3, 16), (8, 4)]:
        x = _at_offset(rng.standard_normal((n, cols)).astype(np.float32), offset)
        lanes = np.full((n, rows), np.nan, np.float32)
        for i in range(n):
            kernels.gemm(dtype, data, rows, cols, x[i : i + 1], lanes[i : i + 1], n_threads=1)
        by_threads = []
        for t in (1, 2, 3):
            y = np.full((n, rows), np.nan, np.float32)
            kernels.gemm(dtype, data, rows, cols, x, y, n_threads=t)
            by_threads.append(y)
        want = x.astype(np.float64) @ ref
        scale = np.sqrt(cols / 160)  # fp32 summation error grows with the row length
        np.testing.assert_allclose(by_threads[0], lanes, rtol=1e-5, atol=1e-4 * scale, err_msg=f"n={n} at {offset}")
        np.testing.assert_allclose(by_threads[0], want, rtol=1e-5, atol=1e-4 * scale, err_msg=f"n={n}")
        for t, y in zip((2, 3), by_threads[1:], strict=True):  # each row is summed by one thread, in one order
            np.testing.assert_array_equal(y, by_threads[0], err_msg=f"n={n}, {t} threads")


@pytest.mark.parametrize("n", [32, 33, 38, 61])
def test_the_many_token_path_takes_any_rows_columns_and_alignment(kernels: native.Kernels, n: int) -> None:
    """A prefill's GEMM (32 tokens or more): rows not a multiple of its 16-row strips, fp16 rows not whole 32-column
    blocks, token counts not whole groups of six, X not on a 64-byte line."""
    rng = np.random.default_rng(n)
    rows, cols = 21, 70
    w = rng.standard_normal((cols, rows)).astype(np.float32)
    data, ref = np.ascontiguousarray(w.T.astype(np.float16)), w.astype(np.float16).astype(np.float64)
    x = _at_offset(rng.standard_normal((n, cols)).astype(np.float32), 4)
    y = np.full((n + 1, rows), np.nan, np.float32)
    kernels.gemm("fp16", data, rows, cols, x, y[:n], n_threads=2)
    np.testing.assert_allclose(y[:n], x.astype(np.float64) @ ref, rtol=1e-5, atol=1e-4)
    assert np.isnan(y[n]).all()  # nothing past the last token's outputs is written


@pytest.mark.parametrize("dtype", ["fp16", "q8_0"])
@pytest.mark.parametrize("n", [1, 8, 32])
def test_rows_of_no_columns_give_zeros_on_every_path(kernels: native.Kernels, dtype: str, n: int) -> None:
    """Empty sums are zeros; the many-token path once divided by the row length (SIGFPE on 32 tokens)."""
    w = np.zeros((4, 0), np.float16 if dtype == "fp16" else np.uint8)
    y = np.full((n, 4), np.nan, np.float32)
    kernels.gemm(dtype, w, 4, 0, np.zeros((n, 0), np.float32), y, n_threads=2)
    np.testing.assert_array_equal(y, np.zeros((n, 4), np.float32))


@pytest.mark.parametrize("dtype", sorted(QTYPES))
@pytest.mark.parametrize("n", [1, 2])
def test_decode_gemvs_keep_float32_accuracy_over_a_wide_range_of_activations(
    kernels: native.Kernels, dtype: str, n: int
) -> None:
    """The 1-2 token path writes each activation as 16-bit parts of its block's scale: over activations spanning
    10^-8.7..10^8.7 its error relative to sum |w x| stays what fp32 rounding gives. Without the low parts it would
    be ~1e-5 (tried)."""
    rng = np.random.default_rng(21)
    rows, cols = 96, 1536
    data, ref = _stored(dtype, rows, cols, rng)
    for spread in (0.0, 4.0, 20.0):
        x = (rng.standard_normal((n, cols)) * np.exp(rng.uniform(-spread, spread, (n, cols)))).astype(np.float32)
        y = np.full((n, rows), np.nan, np.float32)
        kernels.gemm(dtype, data, rows, cols, x, y, n_threads=2)
        want = x.astype(np.float64) @ ref
        scale = np.abs(x.astype(np.float64)) @ np.abs(ref)
        assert np.max(np.abs(y - want) / scale) < 4e-6, f"spread e^{spread}"


def _q40_block(nibbles: list[int], d: float) -> np.ndarray:
    """One q4_0 block of 32 weights (d * (q - 8)), the nibbles in element order."""
    q = np.array(nibbles, np.uint8)
    return np.concatenate([np.array([d], np.float16).view(np.uint8), q[:16] | (q[16:] << 4)]).reshape(1, 18)


@pytest.mark.parametrize("n", [1, 2])
def test_decode_gemvs_of_activations_the_integer_path_cannot_hold_are_the_float_paths(
    kernels: native.Kernels, n: int
) -> None:
    """Rows of tiny magnitudes (32767 / amax overflows), of sums past FLT_MAX, or with an infinity: computed as the
    float path does, not rounded to 16-bit parts (a hostile tester's inputs: wrong signs, -inf where the sum is 0,
    NaN where the float path gives inf)."""
    d = float(np.float16(0.001))
    w = _q40_block([7] * 16 + [9] * 16, 0.001)  # -d sixteen times, +d sixteen times: the sum is 0
    w_vals = np.array([-d] * 16 + [d] * 16)
    ones = _q40_block([9] * 32, 1.0)  # every weight 1
    cases = [
        (ones, np.ones(32), np.full(32, 1e-36, np.float32)),
        (ones, np.ones(32), np.array([1e-36] + [0.0] * 31, np.float32)),
        (w, w_vals, np.full(32, 3e38, np.float32)),
        (w, w_vals, np.full(32, 1.2e37, np.float32)),
        (ones, np.ones(32), np.array([np.inf] + [1.0] * 31, np.float32)),
        (ones, np.ones(32), np.array([-np.inf] + [1.0] * 31, np.float32)),
    ]
    for data, weights, row in cases:
        with np.errstate(invalid="ignore"):
            want = float(np.sum(weights * row.astype(np.float64)))
            scale = float(np.sum(np.abs(weights * row.astype(np.float64))))
        x = np.stack([row] * n)
        y = np.full((n, 1), 7.0, np.float32)
        kernels.gemm("q4_0", data, 1, 32, x, y, n_threads=2)
        for got in y[:, 0].astype(np.float64):
            if np.isinf(want):
                assert got == want, (row[:2], got)
            else:  # fp32 rounding of the float path (its sum of +-3e35 products is not exactly 0)
                assert abs(got - want) <= 1e-6 * scale, (row[:2], got, want)


def test_q4_0_weights_are_exact_beside_an_outlier(kernels: native.Kernels) -> None:
    """q4_0's nibbles are made signed before the integer products: a weight of 0 at an outlier of 1e8 adds nothing
    (the offset term -8 d sum(x) used to cancel against 8 d 1e8 in fp32: 79.6 where the sum is 31 + the outlier's
    block rounding)."""
    data = _q40_block([8] + [9] * 31, 1.0)  # weights 0, 1, 1, ..
    x = np.array([[1e8] + [1.0] * 31], np.float32)
    y = np.zeros((1, 1), np.float32)
    kernels.gemm("q4_0", data, 1, 32, x, y, n_threads=1)
    # what the block's 16-bit parts leave out: at most 2^-32 of 1e8 an element (the float path gives 31)
    assert abs(float(y[0, 0]) - 31.0) < 31 * 1e8 * 2.0**-32 + 1e-3


def test_a_gemm_without_memory_for_its_scratch_says_so(kernels: native.Kernels) -> None:
    """The kernel's scratch mapping refused (an address-space limit): MemoryError naming the GEMM, not "refused
    dtype" (what every failure used to say) and not a crash. In a child process: the limit is process-wide."""
    import subprocess
    import sys

    child = """
import resource, sys
import numpy as np
from calctl.model import native
k = native.kernels()
rows, cols, n = 16, 16384, 48
w = np.zeros((rows, cols // 32 * 34), np.uint8)
x = np.ones((n, cols), np.float32)
y = np.zeros((n, rows), np.float32)
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    k.gemm("q8_0", w, rows, cols, x, y, n_threads=1)
except MemoryError as exc:
    print("MemoryError:", exc)
    sys.exit(0)
print("no error")
sys.exit(1)
"""
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no memory for the scratch of a 48-token q8_0 [16, 16384] GEMM" in r.stdout


@pytest.mark.parametrize("dtype", ["fp16", "q8_0"])
def test_a_long_prompt_gemm_in_several_token_blocks_equals_the_reference(kernels: native.Kernels, dtype: str) -> None:
    """Rows of 4096 weights: the many-token path takes the prompt in blocks of 48 tokens (its ~1 MB panels)."""
    rng = np.random.default_rng(9)
    rows, cols, n = 40, 4096, 100
    data, ref = _stored(dtype, rows, cols, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    y = np.full((n, rows), np.nan, np.float32)
    kernels.gemm(dtype, data, rows, cols, x, y, n_threads=2)
    np.testing.assert_allclose(y, x.astype(np.float64) @ ref, rtol=1e-5, atol=1e-4 * np.sqrt(cols / 160))


def test_concurrent_gemms_from_two_threads_give_the_serial_results(kernels: native.Kernels) -> None:
    """Chips' threads calling the kernel at once (one takes the worker pool, the others run alone), decode GEMMs
    and prompts of the many-token path (each caller has its own packed-token buffer)."""
    rng = np.random.default_rng(8)
    rows, cols = SPLIT_SHAPES["q4_1"]
    data, _ = _stored("q4_1", rows, cols, rng)
    xs = [rng.standard_normal((n, cols)).astype(np.float32) for n in (8, 24, 40, 64)]
    want = []
    for x in xs:
        y = np.empty((x.shape[0], rows), np.float32)
        kernels.gemm("q4_1", data, rows, cols, x, y, n_threads=1)
        want.append(y)
    bad: list[str] = []

    def hammer(i: int) -> None:
        for rep in range(40):
            y = np.full_like(want[i], np.nan)
            kernels.gemm("q4_1", data, rows, cols, xs[i], y, n_threads=2)
            if not np.array_equal(y, want[i]):
                bad.append(f"caller {i} repetition {rep}")

    callers = [threading.Thread(target=hammer, args=(i,)) for i in range(len(xs))]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert not bad, bad


#: Qwen2-shaped: q/k/v biases, interleaved RoPE, an untied LM head (the fused native layer's other branches).
ARCH_BIAS = Architecture(
    family="qwen2", n_layers=2, d_model=64, n_heads=4, n_kv_heads=1, head_dim=16, d_ff=96, vocab_size=200,
    context_limit=64, dtype="q8_0", rope_style="interleaved", attn_bias=True, tie_embeddings=False,
)  # fmt: skip


def _quant_params(dtype: str, arch: Architecture = ARCH) -> dict[str, object]:
    params: dict[str, object] = dict(decoder.init_params(arch, np.random.default_rng(3)))
    for name in list(params):
        if name.rsplit(".", 1)[-1] in MATRICES or name == "embed":
            params[name] = quant.quantize(name, dtype, np.asarray(params[name]))
    return params


@pytest.mark.parametrize("dtype", sorted(QTYPES))
def test_quantised_decoder_matches_the_dequantised_reference(kernels: native.Kernels, dtype: str) -> None:
    params = _quant_params(dtype)
    fast, slow = decoder.prepare(params, ARCH), decoder.prepare(params, ARCH, native=False)
    assert fast.native and not slow.native
    assert fast.head.data is fast.embed.stored.data if fast.embed.stored is not None else False  # tied: one copy
    dense = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    assert fast.nbytes * 3 < sum(v.nbytes for k, v in dense.items() if k.rsplit(".", 1)[-1] in (*MATRICES, "embed"))
    prompt = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    ref = decoder.reference_logits(dense, ARCH, prompt, last_only=True)[0]
    caches = [decoder.KvCache.empty(ARCH, 32) for _ in range(2)]
    outs = [decoder.prefill(w, ARCH, prompt, c) for w, c in zip((fast, slow), caches, strict=True)]
    np.testing.assert_allclose(outs[0], ref, atol=2e-4)
    for step in range(5):
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        tok = int(np.argmax(outs[1]))
        outs = [decoder.decode_step(w, ARCH, tok, c.length, c) for w, c in zip((fast, slow), caches, strict=True)]


def test_a_batched_decode_step_equals_one_step_per_lane(kernels: native.Kernels) -> None:
    w = decoder.prepare(_quant_params("q4_1"), ARCH)
    prompts = [np.array([5, 6, 7]), np.array([9, 8, 7, 6, 5, 4]), np.array([1]), np.array([10, 20, 30, 40, 50])]
    one = [decoder.KvCache.empty(ARCH, 32) for _ in prompts]
    many = [decoder.KvCache.empty(ARCH, 32) for _ in prompts]
    toks = []
    for p, a, b in zip(prompts, one, many, strict=True):
        toks.append(int(np.argmax(decoder.prefill(w, ARCH, p, a))))
        decoder.prefill(w, ARCH, p, b)
    for _ in range(3):
        singles = np.stack([decoder.decode_step(w, ARCH, t, c.length, c) for t, c in zip(toks, one, strict=True)])
        batched = decoder.decode_batch(w, ARCH, np.array(toks), np.array([c.length for c in many]), many)
        np.testing.assert_allclose(batched, singles, rtol=1e-5, atol=1e-5)
        assert [c.length for c in many] == [c.length for c in one]
        toks = [int(t) for t in singles.argmax(axis=1)]


@pytest.mark.parametrize("native_weights", [True, False], ids=["native", "numpy"])
def test_a_decode_step_writes_its_logits_into_the_array_given(kernels: native.Kernels, native_weights: bool) -> None:
    """``out=``: the mock's output buffer, written in place; the same logits as a step that allocates them."""
    w = decoder.prepare(_quant_params("q4_1"), ARCH, native=native_weights)
    prompts = [np.array([5, 6, 7]), np.array([9, 8, 7, 6])]
    plain = [decoder.KvCache.empty(ARCH, 32) for _ in prompts]
    into = [decoder.KvCache.empty(ARCH, 32) for _ in prompts]
    toks = [int(np.argmax(decoder.prefill(w, ARCH, p, c))) for p, c in zip(prompts, plain, strict=True)]
    for p, c in zip(prompts, into, strict=True):
        decoder.prefill(w, ARCH, p, c)
    want = decoder.decode_batch(w, ARCH, np.array(toks), np.array([c.length for c in plain]), plain)
    out = np.full((2, ARCH.vocab_size), np.nan, np.float32)
    got = decoder.decode_batch(w, ARCH, np.array(toks), np.array([c.length for c in into]), into, out=out)
    assert got is out
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match="logits out"):
        decoder.decode_batch(w, ARCH, np.array(toks), np.array([c.length for c in into]), into, out=out[:1])


def test_gguf_import_keeps_the_blocks_and_passes_golden(cli: Cli, tmp_path: Path) -> None:
    from calctl.package.reader import load_manifest
    from tests.unit.compiler.checkpoint_factory import write_gguf, write_hf_dir

    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama", seed=5)
    g = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights, qtype="Q4_1")
    kept, dense = tmp_path / "kept", tmp_path / "dense"
    assert cli("import", "gguf", g, kept, "--key", TEST_KEY, "--alias", "m").code == 0
    assert cli("import", "gguf", g, dense, "--key", TEST_KEY, "--alias", "m", "--dtype", "fp32").code == 0
    mk, md = load_manifest(kept).model("m"), load_manifest(dense).model("m")
    assert mk.architecture.dtype == "q4_1"
    assert {t.dtype for t in mk.params if t.name.rsplit(".", 1)[-1] in MATRICES} == {"q4_1"}
    assert sum(t.nbytes for t in mk.params) * 4 < sum(t.nbytes for t in md.params)
    # the kept blocks hold exactly the weights the dequantised import holds (Llama's Q/K rows un-permuted)
    pk = decoder.load_params(kept, mk.params)
    pd = decoder.load_params(dense, md.params)
    for name in pk:
        if name.rsplit(".", 1)[-1] in MATRICES:
            np.testing.assert_array_equal(pk[name], pd[name], err_msg=name)
    r = cli("run-golden", kept, "--trusted-key", str(TEST_KEY.with_suffix(".pub")), "--format", "json")
    assert r.code == 0, r.out


def test_loading_refuses_a_quantised_tensor_whose_rows_are_not_whole_blocks(tmp_path: Path) -> None:
    from calctl.package.model import ParamTensor

    t = ParamTensor(name="layers.0.wq", file="p.bin", dtype="q4_0", shape=(64, 64), offset=0)
    assert t.nbytes == 64 * 2 * 18
    (tmp_path / "p.bin").write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="not a multiple"):
        decoder.load_params(tmp_path, (ParamTensor("layers.0.wq", "p.bin", "q4_0", (40, 64), 0),), keep_dtype=True)


@pytest.mark.parametrize(
    ("dtype", "arch"),
    [*((d, ARCH) for d in sorted(QTYPES)), ("q8_0", ARCH_BIAS)],
    ids=["q4_0", "q4_1", "q8_0", "qwen2"],
)
def test_nine_batched_lanes_equal_numpy_lane_by_lane(kernels: native.Kernels, dtype: str, arch: Architecture) -> None:
    """A full 8-lane tile plus one, in the fused native decode layer, against the numpy fallback lane by lane."""
    params = _quant_params(dtype, arch)
    fast, slow = decoder.prepare(params, arch), decoder.prepare(params, arch, native=False)
    assert fast.native_layers is not None and slow.native_layers is None
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, arch.vocab_size, size=int(n)) for n in (1, 2, 3, 5, 8, 9, 13, 17, 30)]
    many = [decoder.KvCache.empty(arch, 40) for _ in prompts]
    one = [decoder.KvCache.empty(arch, 40) for _ in prompts]
    toks = []
    for p, a, b in zip(prompts, many, one, strict=True):
        decoder.prefill(fast, arch, p, a)
        toks.append(int(np.argmax(decoder.prefill(slow, arch, p, b))))
    for _ in range(3):
        batched = decoder.decode_batch(fast, arch, np.array(toks), np.array([c.length for c in many]), many)
        singles = np.stack([decoder.decode_step(slow, arch, t, c.length, c) for t, c in zip(toks, one, strict=True)])
        np.testing.assert_allclose(batched, singles, rtol=1e-4, atol=1e-4)
        for a, b in zip(many, one, strict=True):  # the native attention wrote the same K/V rows
            assert a.length == b.length
            np.testing.assert_allclose(a.k[:, : a.length], b.k[:, : b.length], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(a.v[:, : a.length], b.v[:, : b.length], rtol=1e-4, atol=1e-4)
        toks = [int(t) for t in singles.argmax(axis=1)]


@pytest.mark.parametrize("length", [1, 7, 8, 9, 70])
@pytest.mark.parametrize("hd", [20, 40, 64])  # scalar tails; a 32-column block and an 8; four positions at a time
def test_native_attention_equals_numpy(kernels: native.Kernels, length: int, hd: int) -> None:
    rng = np.random.default_rng(length)
    heads, kv_heads, lanes = 6, 2, 3
    k_cache = rng.standard_normal((lanes, 80, kv_heads, hd)).astype(np.float32)
    v_cache = rng.standard_normal((lanes, 80, kv_heads, hd)).astype(np.float32)
    q = rng.standard_normal((lanes, heads, hd)).astype(np.float32)
    k_new = rng.standard_normal((lanes, kv_heads, hd)).astype(np.float32)
    v_new = rng.standard_normal((lanes, kv_heads, hd)).astype(np.float32)
    pos = np.array([length - 1, max(0, length - 3), length // 2], np.int64)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    want_k[np.arange(lanes), pos], want_v[np.arange(lanes), pos] = k_new, v_new
    want = np.stack(
        [decoder._attend(q[i : i + 1], want_k[i, : p + 1], want_v[i, : p + 1], int(p))[0] for i, p in enumerate(pos)]
    )
    stride = k_cache.strides[0]
    kb = k_cache.ctypes.data + stride * np.arange(lanes, dtype=np.int64)
    vb = v_cache.ctypes.data + stride * np.arange(lanes, dtype=np.int64)
    got = kernels.attend(q, k_new, v_new, kb, vb, pos, kv_heads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(k_cache, want_k)
    np.testing.assert_array_equal(v_cache, want_v)


@pytest.mark.parametrize("poison", ["nan in q", "nan in K", "+inf in K", "inf in q"])
def test_native_attention_spreads_nan_as_softmax_does(kernels: native.Kernels, poison: str) -> None:
    """A NaN score or an infinite one makes that head's output NaN (softmax's own arithmetic); the kernel dropped a
    NaN position or gave the plain mean of V. The other heads stay finite."""
    hd, heads, kv_heads = 8, 2, 2
    cache_k = np.ones((4, kv_heads, hd), np.float32)
    cache_v = np.stack([np.full((kv_heads, hd), v, np.float32) for v in (1.0, 3.0, 5.0, 7.0)])
    q = np.ones((1, heads, hd), np.float32)
    k_new = np.ones((1, kv_heads, hd), np.float32)
    if poison == "nan in q":
        q[0, 0, 0] = np.nan
    elif poison == "inf in q":
        q[0, 0, 0] = np.inf
    elif poison == "nan in K":
        cache_k[1, 0, 3] = np.nan
    else:
        cache_k[1, 0, 3] = np.inf
    addr_k = np.array([cache_k.ctypes.data], np.int64)
    addr_v = np.array([cache_v.ctypes.data], np.int64)
    got = kernels.attend(q, k_new, np.full((1, kv_heads, hd), 9.0, np.float32), addr_k, addr_v, np.array([2]), kv_heads)
    assert np.isnan(got[0, :hd]).all(), got[0, :hd]
    assert np.isfinite(got[0, hd:]).all()


def test_native_attention_refuses_heads_that_do_not_group(kernels: native.Kernels) -> None:
    z = np.zeros((1, 5, 4), np.float32)
    kv = np.zeros((1, 2, 4), np.float32)
    cache = np.zeros((4, 2, 4), np.float32)
    addr = np.array([cache.ctypes.data], np.int64)
    with pytest.raises(ValueError, match="5 heads over 2 KV heads"):
        kernels.attend(z, kv, kv, addr, addr, np.array([0], np.int64), 2)
