"""The native kernels' worker pool: a call's result is the same bit for bit on any thread count (issue #55).

Each output of a kernel call is summed by one thread in one order, so 2 or 4 threads must give exactly what one
gives. The race that broke this (a worker claiming a chunk of the next job with the last job's exhausted claim
word, so the next call returned one chunk early) needed a thread preempted in a window of a few instructions:
about once in 10^6 pool jobs on a loaded host. These tests also run on a build with ``-DPOOL_RACE_WINDOW``, which
pauses threads at random in exactly those windows, so the old pool failed them within the first thousand calls.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from calctl.model import decoder, native, quant
from calctl.package.model import Architecture

#: Pauses (~10-40 ns each) a thread may spend in a race window of the stress build.
RACE_WINDOW = 2000


def _compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc): the native kernels cannot be built here; numpy is used instead")
    return cc


@pytest.fixture(scope="module")
def stressed(tmp_path_factory: pytest.TempPathFactory) -> native.Kernels:
    """The kernels built with the race windows widened (a library of their own, with its own worker pool)."""
    out = tmp_path_factory.mktemp("native") / "gemv_f16_raced.so"
    native.compile_kernels(_compiler(), out, (f"POOL_RACE_WINDOW={RACE_WINDOW}",))
    return native.Kernels(ctypes.CDLL(str(out)))


@pytest.fixture(scope="module")
def default() -> native.Kernels:
    _compiler()
    k = native.kernels()
    assert k is not None, native.status()  # a compiler is present: the build must work
    return k


@pytest.fixture(params=["default", "race-window"])
def kernels(request: pytest.FixtureRequest) -> native.Kernels:
    return request.getfixturevalue("default" if request.param == "default" else "stressed")


def _gemm_calls(rng: np.random.Generator) -> list[tuple[str, np.ndarray, int, int, np.ndarray]]:
    """GEMMs whose chunk counts rise and fall from one call to the next (the race needed a next job with more
    chunks than the last one's total), on every path: decode GEMVs, the tiled float path, many tokens."""
    calls = []
    for dtype, rows, cols, n in [
        ("q4_1", 256, 256, 1), ("q4_1", 1536, 256, 1), ("q8_0", 256, 768, 2), ("q4_0", 1031, 288, 1),
        ("fp16", 1000, 96, 3), ("q4_1", 300, 288, 40), ("q8_0", 2048, 64, 1), ("q4_1", 96, 1024, 5),
    ]:  # fmt: skip
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        data = w.astype(np.float16) if dtype == "fp16" else quant.quantize("layers.0.wq", dtype, w.T).data
        calls.append((dtype, np.ascontiguousarray(data), rows, cols, rng.standard_normal((n, cols)).astype(np.float32)))
    return calls


def test_gemms_on_2_and_4_threads_equal_one_thread_bit_for_bit(kernels: native.Kernels) -> None:
    rng = np.random.default_rng(55)
    calls = _gemm_calls(rng)
    want = []
    for dtype, data, rows, cols, x in calls:
        y = np.empty((x.shape[0], rows), np.float32)
        kernels.gemm(dtype, data, rows, cols, x, y, n_threads=1)
        want.append(y)
    bad: list[str] = []
    for threads in (2, 4):
        for rep in range(400):
            for i, (dtype, data, rows, cols, x) in enumerate(calls):
                y = np.full((x.shape[0], rows), np.nan, np.float32)  # a row nobody wrote stays NaN
                kernels.gemm(dtype, data, rows, cols, x, y, n_threads=threads)
                if not np.array_equal(y, want[i]):
                    bad.append(f"{threads} threads, repetition {rep}, {dtype} {list(x.shape)} x [{rows}, {cols}]")
    assert not bad, f"{len(bad)} calls differ from one thread's result, first: {bad[:3]}"


def _attention_inputs(rng: np.random.Generator, lanes: int, length: int) -> tuple[tuple[np.ndarray, ...], list[object]]:
    """``attend``'s arguments for ``lanes`` lanes at random positions below ``length`` (2 KV heads), and the
    caches their addresses point into (keep them alive)."""
    heads, kvh, hd = 8, 2, 64
    caches = [rng.standard_normal((2, length + 1, kvh, hd)).astype(np.float32) for _ in range(lanes)]
    args = (
        rng.standard_normal((lanes, heads, hd)).astype(np.float32),
        rng.standard_normal((lanes, kvh, hd)).astype(np.float32),
        rng.standard_normal((lanes, kvh, hd)).astype(np.float32),
        np.array([c[0].ctypes.data for c in caches], np.int64),
        np.array([c[1].ctypes.data for c in caches], np.int64),
        rng.integers(length // 2, length, lanes).astype(np.int64),
    )
    return args, list(caches)


def test_decode_attention_on_2_and_4_threads_equals_one_thread_bit_for_bit(
    kernels: native.Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(56)
    for lanes, length in [(1, 300), (3, 120), (2, 700)]:
        (q, k_new, v_new, kc, vc, pos), _alive = _attention_inputs(rng, lanes, length)
        monkeypatch.setenv("CALCTL_THREADS", "1")
        want = kernels.attend(q, k_new, v_new, kc, vc, pos, 2)
        for threads in ("2", "4"):
            monkeypatch.setenv("CALCTL_THREADS", threads)
            for rep in range(100):
                got = kernels.attend(q, k_new, v_new, kc, vc, pos, 2)
                assert np.array_equal(got, want), f"{lanes} lanes to {length}: {threads} threads, repetition {rep}"


#: Large enough that every GEMM of a decode step and its attention split over the threads.
ARCH = Architecture(
    family="llama", n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=768, vocab_size=2048,
    context_limit=128, dtype="q4_1", rope_style="half", tie_embeddings=True,
)  # fmt: skip


def _greedy(w: decoder.Weights, prompt: np.ndarray, steps: int) -> tuple[list[int], str]:
    """The greedy tokens after ``prompt`` and a digest of every step's logits (bit for bit)."""
    cache = decoder.KvCache.empty(ARCH, prompt.shape[0] + steps + 1)
    logits = decoder.prefill(w, ARCH, prompt, cache)
    out, digest = [], hashlib.sha256()
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = decoder.decode_step(w, ARCH, out[-1], cache.length, cache)
        digest.update(logits.tobytes())
    return out, digest.hexdigest()


def test_the_same_greedy_prompt_gives_the_same_tokens_on_1_2_and_4_threads(
    kernels: native.Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    params: dict[str, object] = dict(decoder.init_params(ARCH, np.random.default_rng(4)))
    for name in list(params):
        if name == "embed" or name.rsplit(".", 1)[-1] in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            params[name] = quant.quantize(name, "q4_1", np.asarray(params[name]))
    load: Callable[[], native.Kernels | None] = lambda: kernels  # noqa: E731
    monkeypatch.setattr(decoder, "_native_kernels", load)
    w = decoder.prepare(params, ARCH)
    assert w.native and w.native_stack is not None  # every layer in one native call, as the mock runs it
    prompt = np.random.default_rng(5).integers(0, ARCH.vocab_size, 60)
    monkeypatch.setenv("CALCTL_THREADS", "1")
    want = _greedy(w, prompt, 40)
    for threads in ("2", "4"):
        monkeypatch.setenv("CALCTL_THREADS", threads)
        diverged = [i for i in range(30) if _greedy(w, prompt, 40) != want]
        assert not diverged, f"{threads} threads: runs {diverged} of 30 left the 1-thread tokens or logits"


def test_a_build_with_extra_defines_is_written_whole(tmp_path: Path) -> None:
    out = tmp_path / "k.so"
    with pytest.raises(RuntimeError, match="failed"):
        native.compile_kernels(_compiler(), out, ("POOL_RACE_WINDOW=(",))  # not a number: the compiler refuses
    assert not out.exists() and list(tmp_path.iterdir()) == []
