"""The optional native GEMV the decoder uses for fp16 weights (``_native/gemv_f16.c``).

Built from source at first use with the system C compiler (``cc`` or ``gcc``,
``-O3 -march=native``) into the calctl cache directory, keyed by the source and
compiler, then loaded with ctypes. Nothing binary is shipped. When there is no
compiler, the CPU lacks F16C/FMA/AVX2, or ``CALCTL_NATIVE=0``, :func:`gemv_f16`
is ``None`` and the decoder stays on numpy; :func:`status` says why.

This module builds and loads one function; it does not decide when to use it.
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

from calctl.records import atomic_output

Gemv = Callable[[np.ndarray, np.ndarray, np.ndarray], None]

_lock = threading.Lock()
_state: dict[str, object] = {}


def _cache_dir() -> Path:
    # Same rule as calctl.compiler.bundled.cache_dir (which sits above this layer).
    env = os.environ.get("CALCTL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "calctl"


class _CompileFailed(Exception):
    pass


def _build() -> tuple[Gemv | None, str]:
    if os.environ.get("CALCTL_NATIVE", "1").strip().lower() in {"0", "false", "no", "off"}:
        return None, "disabled by CALCTL_NATIVE=0"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc or gcc) on PATH"
    source = resources.files("calctl.model").joinpath("_native", "gemv_f16.c").read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    tag = hashlib.sha256(source + version.encode()).hexdigest()[:16]
    out = _cache_dir() / "native" / f"gemv_f16-{tag}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "gemv_f16.c"
            src.write_bytes(source)
            try:
                # Concurrent builders: each compiles to its own temporary file; one rename wins, both are identical.
                with atomic_output(out, mode=0o755) as lib:
                    cmd = [cc, "-O3", "-march=native", "-shared", "-fPIC", "-o", str(lib), str(src)]
                    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    if res.returncode != 0:
                        raise _CompileFailed(
                            f"{' '.join(cmd[:4])} failed: {(res.stderr or res.stdout).strip().splitlines()[-1:]}"
                        )
            except _CompileFailed as exc:
                return None, str(exc)
    try:
        lib_handle = ctypes.CDLL(str(out))
    except OSError as exc:
        return None, f"cannot load {out}: {exc}"
    fn = lib_handle.calctl_gemv_f16
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]

    def gemv(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """``y[:] = w @ x`` for C-contiguous ``w`` float16 [rows, cols], ``x`` float32 [cols], ``y`` float32 [rows]."""
        rows, cols = w.shape
        fn(w.ctypes.data, x.ctypes.data, y.ctypes.data, rows, cols)

    return gemv, f"native fp16 GEMV {out}"


def gemv_f16() -> Gemv | None:
    """The native GEMV, built on first call; None when unavailable (see :func:`status`)."""
    with _lock:
        if "fn" not in _state:
            fn, why = _build()
            _state["fn"], _state["status"] = fn, why
        return _state["fn"]  # type: ignore[return-value]


def status() -> str:
    gemv_f16()
    return str(_state["status"])
