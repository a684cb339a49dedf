"""The optional native kernels the decoder uses (``_native/gemv_f16.c``).

One GEMM over the weights as the package stores them (fp16, or the GGML blocks
q4_0, q4_1 and q8_0, dequantised inside the kernel with fp32 accumulation; up to
eight tokens share each dequantised block), a row dequantiser for embedding
lookups, a decode step's attention of several lanes over their own KV caches,
and a whole decoder layer of one decode step (:class:`LayerDesc`).

Built from source at first use with the system C compiler (``cc`` or ``gcc``,
``-O3 -march=native -pthread``) into
the calctl cache directory, keyed by the source and compiler, then loaded with
ctypes. Nothing binary is shipped. When there is no compiler, the CPU lacks
F16C/FMA/AVX2, or ``CALCTL_NATIVE=0``, :func:`kernels` is ``None`` and the
decoder stays on numpy; :func:`status` says why.

Threads: :func:`threads` is what one call may use, the CPUs this process may run
on (``os.sched_getaffinity``), or ``CALCTL_THREADS`` when set. The kernels' own
worker pool splits a call into chunks the calling thread and any awake worker
claim; the caller never waits for a worker that has not started (a loaded host),
and idle workers poll for ~3 us, then sleep. Each output is summed by one thread in
one order, so a call's result is the same bit for bit on any thread count (issue #55:
a race in the pool's claims once broke that; tests/unit/compiler/test_pool_determinism.py
builds the kernels with ``-DPOOL_RACE_WINDOW`` through :func:`compile_kernels` to steer
threads into it).

This module builds and loads the kernels; it does not decide when to use them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from calctl.cache import cache_dir
from calctl.records import atomic_output

Gemv = Callable[[np.ndarray, np.ndarray, np.ndarray], None]

#: Kernel dtype codes (``_native/gemv_f16.c``) of the package dtypes it computes on.
KERNEL_DTYPES = {"fp16": 0, "q4_0": 1, "q4_1": 2, "q8_0": 3}

_lock = threading.Lock()
_state: dict[str, object] = {}


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def _source() -> bytes:
    return resources.files("calctl.model").joinpath("_native", "gemv_f16.c").read_bytes()


def compile_kernels(cc: str, out: Path, defines: tuple[str, ...] = ()) -> None:
    """Compile ``_native/gemv_f16.c`` into the shared library ``out`` (written whole or not at all).

    ``defines`` are extra ``-D`` macros (a test's ``POOL_RACE_WINDOW=N``); raises :class:`RuntimeError` naming the
    compiler's last line when it fails.
    """
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "gemv_f16.c"
        src.write_bytes(_source())
        # Concurrent builders: each compiles to its own temporary file; one rename wins, both are identical.
        with atomic_output(out, mode=0o755) as lib:
            cmd = [cc, "-O3", "-march=native", "-pthread", *(f"-D{d}" for d in defines), "-shared", "-fPIC"]
            res = subprocess.run([*cmd, "-o", str(lib), str(src), "-lm"], capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise RuntimeError(
                    f"{' '.join(cmd[:4])} failed: {(res.stderr or res.stdout).strip().splitlines()[-1:]}"
                )


def _build() -> tuple[Kernels | None, str]:
    if os.environ.get("CALCTL_NATIVE", "1").strip().lower() in {"0", "false", "no", "off"}:
        return None, "disabled by CALCTL_NATIVE=0"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc or gcc) on PATH"
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    tag = hashlib.sha256(_source() + version.encode()).hexdigest()[:16]
    out = cache_dir() / "native" / f"gemv_f16-{tag}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            compile_kernels(cc, out)
        except RuntimeError as exc:
            return None, str(exc)
    try:
        lib_handle = ctypes.CDLL(str(out))
    except OSError as exc:
        return None, f"cannot load {out}: {exc}"
    return Kernels(lib_handle), f"native weight kernels {out}"


class LayerDesc(ctypes.Structure):
    """One decoder layer's shapes and weight addresses (``calctl_layer`` in ``_native/gemv_f16.c``).

    It holds raw addresses: the arrays it was made from must outlive it (:func:`layer_desc` keeps them).
    """

    _fields_ = [
        ("d_model", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("hd", ctypes.c_int64),
        ("d_ff", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("half_style", ctypes.c_int32),
        ("attn_norm", ctypes.c_void_p),
        ("bqkv", ctypes.c_void_p),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("mlp_norm", ctypes.c_void_p),
        ("qkv_dtype", ctypes.c_int32),
        ("wo_dtype", ctypes.c_int32),
        ("gu_dtype", ctypes.c_int32),
        ("down_dtype", ctypes.c_int32),
        ("wqkv", ctypes.c_void_p),
        ("wo", ctypes.c_void_p),
        ("w_gate_up", ctypes.c_void_p),
        ("w_down", ctypes.c_void_p),
    ]


def _f32_address(a: np.ndarray | None, size: int) -> int | None:
    if a is None:
        return None
    if a.dtype != np.float32 or not a.flags.c_contiguous or a.size != size:
        raise ValueError(f"a layer vector must be float32 [{size}] C-contiguous, not {a.dtype} {list(a.shape)}")
    return int(a.ctypes.data)


def layer_desc(
    shape: tuple[int, int, int, int, int],
    eps: float,
    rope_style: str,
    vectors: tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray],
    matrices: tuple[tuple[str, np.ndarray], ...],
) -> tuple[LayerDesc, tuple[object, ...]]:
    """The descriptor of one layer and the arrays it points into (keep both alive together).

    ``shape`` is ``(d_model, heads, kv_heads, head_dim, d_ff)``; ``vectors`` the float32 ``attn_norm, bqkv,
    q_norm, k_norm, mlp_norm`` (None where the family has none); ``matrices`` the ``(dtype, stored rows)`` of
    ``wqkv, wo, w_gate_up, w_down``, C-contiguous.
    """
    d, heads, kvh, hd, ff = shape
    qkv = (heads + 2 * kvh) * hd
    attn_norm, bqkv, q_norm, k_norm, mlp_norm = vectors
    for _, m in matrices:
        if not m.flags.c_contiguous:
            raise ValueError("a layer matrix must be C-contiguous stored rows")
    (tq, wq), (to, wo), (tg, wg), (td, wd) = matrices
    desc = LayerDesc(
        d, heads, kvh, hd, ff, eps, 1 if rope_style == "half" else 0,
        _f32_address(attn_norm, d), _f32_address(bqkv, qkv), _f32_address(q_norm, hd), _f32_address(k_norm, hd),
        _f32_address(mlp_norm, d), KERNEL_DTYPES[tq], KERNEL_DTYPES[to], KERNEL_DTYPES[tg], KERNEL_DTYPES[td],
        wq.ctypes.data, wo.ctypes.data, wg.ctypes.data, wd.ctypes.data,
    )  # fmt: skip
    return desc, (vectors, matrices)


class Kernels:
    """The loaded kernels, called with numpy arrays (shapes and dtypes checked by the caller)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._gemm = lib.calctl_wgemm
        self._gemm.restype = ctypes.c_int
        self._gemm.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, i64, ctypes.c_int]
        self._rows = lib.calctl_wrows
        self._rows.restype = ctypes.c_int
        self._rows.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr]
        self._attend = lib.calctl_attend_decode
        self._attend.restype = ctypes.c_int
        self._attend.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ctypes.c_int]
        self._layers = lib.calctl_decode_layers
        self._layers.restype = ctypes.c_int
        self._layers.argtypes = [
            ctypes.POINTER(LayerDesc),
            i64,
            i64,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
            ctypes.c_int,
        ]

    def gemm(
        self, dtype: str, w: np.ndarray, rows: int, cols: int, x: np.ndarray, y: np.ndarray, n_threads: int = 0
    ) -> None:
        """``y[n, rows] = x[n, cols] @ W.T`` for the stored rows ``w`` (C-contiguous), ``x``/``y`` float32 C-contiguous.

        On up to ``n_threads`` threads (0: :func:`threads`); the result does not depend on the thread count.
        """
        rc = self._gemm(
            KERNEL_DTYPES[dtype], w.ctypes.data, rows, cols, x.ctypes.data, cols, x.shape[0], y.ctypes.data, rows,
            n_threads or threads(),
        )  # fmt: skip
        if rc == -2:
            raise MemoryError(
                f"native kernel: no memory for the scratch of a {x.shape[0]}-token {dtype} [{rows}, {cols}] GEMM"
            )
        if rc != 0:
            raise ValueError(f"native kernel refused dtype {dtype} [{rows}, {cols}]")

    def attend(
        self,
        q: np.ndarray,
        k_new: np.ndarray,
        v_new: np.ndarray,
        k_rows: np.ndarray,
        v_rows: np.ndarray,
        positions: np.ndarray,
        kv_heads: int,
    ) -> np.ndarray:
        """One decode step's attention for ``n`` lanes, each over its own cache; ``[n, heads * head_dim]``.

        ``q [n, heads, head_dim]`` and ``k_new``/``v_new [n, kv_heads, head_dim]`` float32 C-contiguous; ``k_rows``/
        ``v_rows`` int64 ``[n]`` the addresses of each lane's ``[capacity, kv_heads, head_dim]`` float32 cache of this
        layer, which must stay alive; ``positions`` int64 ``[n]``. Writes each lane's new K/V row at its position
        first, then attends positions ``0..position``.
        """
        n, heads, hd = q.shape
        out = np.empty((n, heads * hd), np.float32)
        rc = self._attend(
            n, heads, kv_heads, hd, q.ctypes.data, k_new.ctypes.data, v_new.ctypes.data, k_rows.ctypes.data,
            v_rows.ctypes.data, positions.ctypes.data, out.ctypes.data, threads(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"native attention refused {n} lanes of {heads} heads over {kv_heads} KV heads")
        return out

    def decode_layers(
        self,
        descs: ctypes.Array[LayerDesc],
        x: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        caches: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        positions: np.ndarray,
    ) -> None:
        """Every layer of a decode step for ``n`` lanes in one call, ``x [n, d_model]`` float32 updated in place.

        ``descs`` the layers in order; ``cos``/``sin [n, head_dim/2]`` float32; ``caches`` int64 ``[n]`` arrays of
        each lane's K cache address, its layer stride in bytes, its V cache address and stride (each lane's cache
        ``[layers, capacity, kv_heads, head_dim]`` float32, which must stay alive); ``positions`` int64 ``[n]``.
        Layer ``i`` writes each lane's new K/V row at its position, then attends positions ``0..position``.
        """
        kb, ks, vb, vs = caches
        rc = self._layers(
            descs, len(descs), x.shape[0], x.ctypes.data, cos.ctypes.data, sin.ctypes.data, kb.ctypes.data,
            ks.ctypes.data, vb.ctypes.data, vs.ctypes.data, positions.ctypes.data, threads(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"native decode layers refused {x.shape[0]} lanes (shape or allocation)")

    def rows(self, dtype: str, w: np.ndarray, rows: int, cols: int, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of the stored matrix, dequantised to float32 ``[len(idx), cols]``."""
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        out = np.empty((idx.shape[0], cols), np.float32)
        if self._rows(KERNEL_DTYPES[dtype], w.ctypes.data, rows, cols, idx.ctypes.data, idx.shape[0], out.ctypes.data):
            raise ValueError(f"row index out of range 0..{rows - 1} or dtype {dtype} refused")
        return out


def trim_heap() -> None:
    """Give the allocator's free pages back to the system (glibc ``malloc_trim``; nothing elsewhere).

    Loading a model reads each tensor, then fuses q/k/v and gate/up into new arrays: the tensors read
    first are freed in the middle of the heap, where glibc keeps them resident (SmolLM2: 41 MB, 45 % of its
    weights) until trimmed.
    """
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def threads() -> int:
    """Threads one kernel call may use: ``CALCTL_THREADS``, else the CPUs this process may run on."""
    env = os.environ.get("CALCTL_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def kernels() -> Kernels | None:
    """The native kernels, built on first call; None when unavailable (see :func:`status`)."""
    with _lock:
        if "fn" not in _state:
            fn, why = _build()
            _state["fn"], _state["status"] = fn, why
        return _state["fn"]  # type: ignore[return-value]


def gemv_f16() -> Gemv | None:
    """The fp16 GEMV ``y[:] = w @ x`` (``w`` float16 [rows, cols]) on the native kernels; None when unavailable."""
    k = kernels()
    if k is None:
        return None

    def gemv(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        rows, cols = w.shape
        k.gemm("fp16", w, rows, cols, x.reshape(1, cols), y.reshape(1, rows))

    return gemv


def status() -> str:
    kernels()
    return str(_state["status"])
