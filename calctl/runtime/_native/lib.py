"""ctypes declarations of the CalRT C ABI 1.x (docs/calrt-c-abi.md, ``reference/calrt.h``).

:func:`load_library` opens the shim, checks that *every* function calctl calls
is exported (naming the first missing symbol and the path), sets ``argtypes``
and ``restype`` for each of them, and checks ``calrt_abi_version`` (major must
equal :data:`ABI_MAJOR`, minor at least :data:`ABI_MINOR`). Any failure is a
:class:`LibraryError` (exit 3).

The optional extensions of ``reference/calrt_ext.h`` (:data:`EXTENSIONS`: the
model description a computing board needs, and a fault-injection test hook) are
declared when the library exports them and are ``None`` otherwise; a vendor
shim exports none of them (docs/calrt-c-abi.md §11).

This module declares and loads; it never calls into a device
(:mod:`calctl.runtime._native.backend` does).
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
import time
from ctypes import POINTER, c_char, c_char_p, c_int32, c_int64, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.runtime.errors import LibraryError

ABI_MAJOR = 1
ABI_MINOR = 0

MAX_CHIPS = 16
MAX_DIMS = 6
VERSION_LEN = 64
UNKNOWN_U64 = 2**64 - 1
KV_NONE = 0
DIM_BATCH = -1
WAIT_MAX_MS = 2**32 - 2

GRAPH_PREFILL, GRAPH_DECODE = 0, 1
DTYPE_CODES = {
    "int8": 1,
    "uint8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "fp16": 6,
    "float16": 6,
    "bf16": 7,
    "bfloat16": 7,
    "fp32": 8,
    "float32": 8,
}

calrt_status = c_int32
calrt_device_p = c_void_p
calrt_calbin_p = c_void_p
calrt_buffer_p = c_void_p
calrt_job_id = c_uint64
calrt_kv_seq = c_uint64


class CalrtVersions(ctypes.Structure):
    _fields_ = [("runtime", c_char * VERSION_LEN), ("driver", c_char * VERSION_LEN), ("firmware", c_char * VERSION_LEN)]


class CalrtTopology(ctypes.Structure):
    _fields_ = [("chips", c_uint32), ("calcores_per_chip", c_uint32), ("dram_bytes", c_uint64 * MAX_CHIPS)]


class CalrtMemory(ctypes.Structure):
    _fields_ = [("used_bytes", c_uint64), ("total_bytes", c_uint64)]


class CalrtCounters(ctypes.Structure):
    _fields_ = [("pending", c_uint64), ("finished", c_uint64), ("failed", c_uint64)]


class CalrtTensorDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_uint32), ("rank", c_uint32), ("dims", c_int64 * MAX_DIMS)]


class CalrtGraphDesc(ctypes.Structure):
    _fields_ = [
        ("name", c_char_p),
        ("model", c_char_p),
        ("kind", c_uint32),
        ("chip_mask", c_uint32),
        ("max_seq", c_uint32),
        ("n_batch_profiles", c_uint32),
        ("batch_profiles", POINTER(c_uint32)),
        ("n_inputs", c_uint32),
        ("inputs", POINTER(CalrtTensorDesc)),
        ("n_outputs", c_uint32),
        ("outputs", POINTER(CalrtTensorDesc)),
        ("valid_length_input", c_char_p),
        ("positions_input", c_char_p),
        ("lane_valid_input", c_char_p),
    ]


class CalrtModelDesc(ctypes.Structure):
    _fields_ = [("alias", c_char_p), ("chip_mask", c_uint32), ("kv_max_sequences", c_uint32), ("kv_max_seq", c_uint32)]


class CalrtCalbinDesc(ctypes.Structure):
    _fields_ = [
        ("path", c_char_p),
        ("n_graphs", c_uint32),
        ("graphs", POINTER(CalrtGraphDesc)),
        ("n_models", c_uint32),
        ("models", POINTER(CalrtModelDesc)),
        ("n_chips", c_uint32),
        ("plan_bytes", POINTER(c_uint64)),
    ]


class CalrtJobDesc(ctypes.Structure):
    _fields_ = [
        ("graph", c_char_p),
        ("inputs", calrt_buffer_p),
        ("outputs", calrt_buffer_p),
        ("engine", c_uint32),
        ("batch", c_uint32),
        ("n_kv", c_uint32),
        ("kv", POINTER(calrt_kv_seq)),
        ("generation", c_uint64),
    ]


class CalrtJobInfo(ctypes.Structure):
    _fields_ = [
        ("id", calrt_job_id),
        ("state", c_uint32),
        ("status", calrt_status),
        ("chip_mask", c_uint32),
        ("engine", c_uint32),
        ("generation", c_uint64),
        ("submit_ns", c_uint64),
        ("start_ns", c_uint64),
        ("end_ns", c_uint64),
    ]


class CalrtExtParam(ctypes.Structure):
    _fields_ = [
        ("role", c_uint32),
        ("layer", c_uint32),
        ("file", c_char_p),
        ("offset", c_uint64),
        ("dtype", c_uint32),
        ("elements", c_uint64),
    ]


class CalrtExtModelDesc(ctypes.Structure):
    _fields_ = [
        ("version", c_uint32),
        ("alias", c_char_p),
        ("family", c_char_p),
        ("n_layers", c_uint32),
        ("d_model", c_uint32),
        ("n_heads", c_uint32),
        ("n_kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("d_ff", c_uint32),
        ("vocab_size", c_uint32),
        ("flags", c_uint32),
        ("rope_theta", ctypes.c_double),
        ("norm_eps", ctypes.c_double),
        ("n_params", c_uint32),
        ("params", POINTER(CalrtExtParam)),
    ]


EXT_MODEL_VERSION = 1
EXT_TIED_EMBEDDINGS, EXT_QKV_BIAS, EXT_QK_NORM, EXT_ROPE_HALF = 0x1, 0x2, 0x4, 0x8
#: calrt_ext_param.role codes (calrt_ext.h): the model-wide tensors, then the per-layer ones.
EXT_ROLES = {"embed": 1, "final_norm": 2, "lm_head": 3}
EXT_LAYER_ROLES = {
    "attn_norm": 10,
    "wq": 11,
    "wk": 12,
    "wv": 13,
    "wo": 14,
    "mlp_norm": 15,
    "w_gate": 16,
    "w_up": 17,
    "w_down": 18,
    "bq": 19,
    "bk": 20,
    "bv": 21,
    "q_norm": 22,
    "k_norm": 23,
}
#: calrt_ext_fault_set codes (calrt_ext.h; the stub's calrt_stub_set_fault uses the same).
EXT_FAULTS = {
    "busy": 1,
    "hang": 2,
    "ccu": 3,
    "no_chip_memory": 4,
    "delay_ms": 5,
    "dma": 6,
    "no_chip_reset": 7,
    "reset_fail": 8,
}

EXT_ID_LEN = 64
EXT_DEVICE_UNKNOWN, EXT_DEVICE_HARDWARE, EXT_DEVICE_SOFTWARE_MODEL = 0, 1, 2


class CalrtExtIdentity(ctypes.Structure):
    _fields_ = [("id", c_char * EXT_ID_LEN), ("kind", c_uint32)]


class CalrtMemTiming(ctypes.Structure):
    """``calrt_mem_timing`` (calrt_ext.h): a DMA's start and end on the device clock, 0 when not stamped."""

    _fields_ = [("start_ns", c_uint64), ("end_ns", c_uint64)]


_P = POINTER
#: Every function calctl calls: name -> (restype, argtypes). The ABI is exactly this table.
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "calrt_abi_version": (calrt_status, [_P(c_uint32), _P(c_uint32)]),
    "calrt_status_string": (c_char_p, [calrt_status]),
    "calrt_device_open": (calrt_status, [_P(calrt_device_p)]),
    "calrt_device_close": (calrt_status, [calrt_device_p]),
    "calrt_versions_get": (calrt_status, [calrt_device_p, _P(CalrtVersions)]),
    "calrt_topology_get": (calrt_status, [calrt_device_p, _P(CalrtTopology)]),
    "calrt_calbin_create": (calrt_status, [calrt_device_p, _P(CalrtCalbinDesc), _P(calrt_calbin_p)]),
    "calrt_calbin_release": (calrt_status, [calrt_device_p, calrt_calbin_p]),
    "calrt_configure": (calrt_status, [calrt_device_p, calrt_calbin_p]),
    "calrt_reset_configuration": (calrt_status, [calrt_device_p]),
    "calrt_buffer_create": (calrt_status, [calrt_device_p, c_uint64, _P(calrt_buffer_p)]),
    "calrt_buffer_data": (calrt_status, [calrt_device_p, calrt_buffer_p, _P(c_void_p)]),
    "calrt_buffer_release": (calrt_status, [calrt_device_p, calrt_buffer_p]),
    "calrt_job_submit": (calrt_status, [calrt_device_p, _P(CalrtJobDesc), _P(calrt_job_id)]),
    "calrt_job_query": (calrt_status, [calrt_device_p, calrt_job_id, _P(CalrtJobInfo)]),
    "calrt_job_wait": (calrt_status, [calrt_device_p, calrt_job_id, c_uint32, _P(CalrtJobInfo)]),
    "calrt_job_wait_any": (calrt_status, [calrt_device_p, _P(calrt_job_id), c_uint32, c_uint32, _P(c_uint32)]),
    "calrt_job_release": (calrt_status, [calrt_device_p, calrt_job_id]),
    "calrt_kv_can_allocate": (calrt_status, [calrt_device_p, c_char_p, c_uint32, _P(c_uint32)]),
    "calrt_kv_allocate": (calrt_status, [calrt_device_p, c_char_p, _P(calrt_kv_seq)]),
    "calrt_kv_append": (calrt_status, [calrt_device_p, calrt_kv_seq, c_uint32, _P(c_uint32)]),
    "calrt_kv_commit": (calrt_status, [calrt_device_p, calrt_kv_seq]),
    "calrt_kv_rollback": (calrt_status, [calrt_device_p, calrt_kv_seq]),
    "calrt_kv_remove_tokens_at_end": (calrt_status, [calrt_device_p, calrt_kv_seq, c_uint32]),
    "calrt_kv_free": (calrt_status, [calrt_device_p, calrt_kv_seq]),
    "calrt_kv_length": (calrt_status, [calrt_device_p, calrt_kv_seq, _P(c_uint32), _P(c_uint32)]),
    "calrt_memory_usage": (calrt_status, [calrt_device_p, c_uint32, _P(CalrtMemory)]),
    "calrt_chip_counters": (calrt_status, [calrt_device_p, c_uint32, _P(CalrtCounters)]),
    "calrt_chip_health": (calrt_status, [calrt_device_p, c_uint32, _P(c_uint32)]),
    "calrt_reset": (calrt_status, [calrt_device_p, c_uint32, c_uint32]),
}

#: Optional extension functions (calrt_ext.h): declared when exported, never required.
EXTENSIONS: dict[str, tuple[Any, list[Any]]] = {
    "calrt_ext_model_set": (calrt_status, [calrt_device_p, calrt_calbin_p, _P(CalrtExtModelDesc)]),
    "calrt_ext_fault_set": (calrt_status, [calrt_device_p, c_uint32, c_uint32]),
    "calrt_ext_device_identity": (calrt_status, [calrt_device_p, _P(CalrtExtIdentity)]),
    # docs/calrt-c-abi.md §11: the boards of the host, before any device is open; both or neither
    "calrt_ext_device_count": (calrt_status, [_P(c_uint32)]),
    "calrt_ext_device_name": (calrt_status, [c_uint32, c_char_p, c_uint32]),
    # docs/calrt-c-abi.md §14: device memory with a chip id (0.7.6 WriteMem/ReadMem); all three or none
    "calrt_mem_window": (calrt_status, [calrt_device_p, c_uint32, _P(c_uint64), _P(c_uint64)]),
    "calrt_write_mem": (calrt_status, [calrt_device_p, c_uint32, c_uint64, c_void_p, c_uint64, _P(CalrtMemTiming)]),
    "calrt_read_mem": (calrt_status, [calrt_device_p, c_uint32, c_uint64, c_void_p, c_uint64, _P(CalrtMemTiming)]),
}
#: The optional calls a shim exports together or not at all (calctl.runtime._native.memory).
MEMORY_CALLS = ("calrt_mem_window", "calrt_write_mem", "calrt_read_mem")
#: The enumeration calls (docs/calrt-c-abi.md §11): both or neither.
ENUMERATION_CALLS = ("calrt_ext_device_count", "calrt_ext_device_name")
#: The most boards calctl reads from a shim's enumeration (a count beyond it is a shim's bug, named).
MAX_ENUMERATED = 256


class CallLog:
    """Every CalRT call made through a library, as it happens: for naming the call a crashed process was in.

    Each call writes one line before it starts (``> name``) and one when it returns (``< name status``), with
    ``os.write`` on an unbuffered descriptor, so the lines are on disk even if the call kills the process
    (SIGSEGV, abort). It also counts, per function, the most threads that were inside it at the same time:
    what shows that calls from several threads really reached the shim at once.
    ``CALCTL_CALRT_CALL_LOG=PATH`` turns it on for a process (the conformance child does).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if self.path else None
        self._mu = threading.Lock()
        self._inside: dict[int, str] = {}  # thread ident -> the call it is in
        self._now: dict[str, int] = {}
        self.most: dict[str, int] = {}  # function -> the most threads inside it at once
        self.most_at_once = 0  # the most threads inside any call at once

    def enter(self, name: str) -> None:
        ident = threading.get_ident()
        if self._fd is not None:
            os.write(self._fd, f"{time.monotonic_ns()} {ident} > {name}\n".encode())
        with self._mu:
            self._inside[ident] = name
            n = self._now[name] = self._now.get(name, 0) + 1
            if n > self.most.get(name, 0):
                self.most[name] = n
            self.most_at_once = max(self.most_at_once, len(self._inside))

    def leave(self, name: str, status: object) -> None:
        ident = threading.get_ident()
        with self._mu:
            self._inside.pop(ident, None)
            self._now[name] -= 1
        if self._fd is not None:
            os.write(self._fd, f"{time.monotonic_ns()} {ident} < {name} {status}\n".encode())

    def truncate(self) -> None:
        """Start the file afresh (the counts stay)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)

    def inside(self) -> dict[int, str]:
        """The threads inside a CalRT call right now, and the call."""
        with self._mu:
            return dict(self._inside)

    def reset_counts(self) -> None:
        with self._mu:
            self.most.clear()
            self.most_at_once = len(self._inside)

    def wrap(self, cdll: Any) -> _LoggedFunctions:
        return _LoggedFunctions(cdll, self)


class _LoggedFunctions:
    """A CDLL whose functions go through a :class:`CallLog` (same names, same argtypes)."""

    def __init__(self, cdll: Any, log: CallLog) -> None:
        self._cdll, self._log = cdll, log

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        fn = getattr(self._cdll, name)
        log = self._log

        def call(*args: Any) -> Any:
            log.enter(name)
            status: object = "raised"
            try:
                status = fn(*args)
                return status
            finally:
                log.leave(name, status if isinstance(status, int) else "-")

        call.__wrapped__ = fn  # type: ignore[attr-defined]  # the ctypes function, with its argtypes/restype
        self.__dict__[name] = call
        return call


def last_call(path: str | Path) -> tuple[str, bool] | None:
    """From a :class:`CallLog` file: the call most recently entered that never returned (``(name, False)``),
    else the last call that returned (``(name, True)``); None for an empty or missing log."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    open_calls: dict[str, str] = {}
    last: str | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        _, ident, arrow, name = parts[:4]
        if arrow == ">":
            open_calls.pop(ident, None)
            open_calls[ident] = name
        elif arrow == "<":
            open_calls.pop(ident, None)
            last = name
    if open_calls:
        return list(open_calls.values())[-1], False
    return (last, True) if last else None


CALL_LOG_ENV = "CALCTL_CALRT_CALL_LOG"
_CALL_LOG: CallLog | None = None


def install_call_log(log: CallLog | None) -> None:
    """Make ``log`` the process's call log: every library loaded from now on goes through it."""
    global _CALL_LOG
    _CALL_LOG = log


def call_log() -> CallLog | None:
    """The process's call log (``CALCTL_CALRT_CALL_LOG``), created on first use; None when not asked for."""
    global _CALL_LOG
    if _CALL_LOG is None and os.environ.get(CALL_LOG_ENV):
        _CALL_LOG = CallLog(os.environ[CALL_LOG_ENV])
    return _CALL_LOG


@dataclass(frozen=True)
class CalrtLibrary:
    """A loaded, checked shim. ``fn`` is the CDLL whose functions all carry argtypes/restype (behind the
    process's :class:`CallLog` when one is on)."""

    path: Path
    fn: Any
    abi: tuple[int, int]
    extensions: frozenset[str] = frozenset()

    def has(self, extension: str) -> bool:
        """Whether the optional extension function ``extension`` (see :data:`EXTENSIONS`) is exported."""
        return extension in self.extensions

    def status_string(self, status: int) -> str:
        raw = self.fn.calrt_status_string(status)
        return raw.decode("utf-8", "replace") if raw else f"status {status}"


def load_library(path: str | Path | None) -> CalrtLibrary:
    """Open and check the CalRT C-ABI shim at ``path``; LibraryError (exit 3) names what is wrong."""
    if path is None or str(path) == "":
        # The way out is in the message, not only the hint: a runner's report keeps the message (#53 item 10).
        raise LibraryError(
            "no CalRT library given: pass --calrt-lib PATH or set CALRT_LIBRARY to the CalRT C-ABI shim; without "
            "a board, `calctl device build-reference` builds the reference board's library",
            hint="docs/calrt-c-abi.md",
        )
    p = Path(path)
    try:
        mode = os.stat(p).st_mode  # a symlink to the library is fine (libfoo.so -> libfoo.so.1)
    except FileNotFoundError:
        raise LibraryError(f"CalRT library {p}: no such file", hint="check --calrt-lib / CALRT_LIBRARY") from None
    except OSError as exc:  # a symlink loop, a path through a file, no permission
        raise LibraryError(
            f"CalRT library {p}: cannot be inspected: {exc.strerror or exc}", hint="check --calrt-lib / CALRT_LIBRARY"
        ) from None
    if not stat.S_ISREG(mode):
        kind = next(
            (
                name
                for test, name in (
                    (stat.S_ISDIR, "a directory"),
                    (stat.S_ISFIFO, "a FIFO"),
                    (stat.S_ISCHR, "a character device"),
                    (stat.S_ISBLK, "a block device"),
                    (stat.S_ISSOCK, "a socket"),
                )
                if test(mode)
            ),
            "a special file",
        )
        raise LibraryError(
            f"CalRT library {p}: is {kind}, not a regular file (a shared library)",
            hint="check --calrt-lib / CALRT_LIBRARY",
        )
    try:
        cdll = ctypes.CDLL(str(p.resolve()))  # CDLL releases the GIL around every call
    except OSError as exc:
        raise LibraryError(f"CalRT library {p}: cannot load: {exc}") from None
    missing = [name for name in SIGNATURES if not hasattr(cdll, name)]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(missing[1:4])})" if len(missing) > 1 else ""
        raise LibraryError(
            f"CalRT library {p}: missing symbol {missing[0]}{more}",
            hint=f"the library must implement the calctl CalRT C ABI {ABI_MAJOR}.{ABI_MINOR} (docs/calrt-c-abi.md)",
        )
    present = {name for name in EXTENSIONS if hasattr(cdll, name)}
    for name, (restype, argtypes) in [*SIGNATURES.items(), *((n, EXTENSIONS[n]) for n in sorted(present))]:
        fn = getattr(cdll, name)
        fn.restype = restype
        fn.argtypes = argtypes
    major, minor = c_uint32(), c_uint32()
    rc = cdll.calrt_abi_version(ctypes.byref(major), ctypes.byref(minor))
    if rc != 0:
        raise LibraryError(f"CalRT library {p}: calrt_abi_version failed with status {rc}")
    if major.value != ABI_MAJOR or minor.value < ABI_MINOR:
        raise LibraryError(
            f"CalRT library {p}: C ABI {major.value}.{minor.value} is "
            f"incompatible; calctl needs {ABI_MAJOR}.x with x >= {ABI_MINOR}",
            hint="use a shim built for this calctl version (docs/calrt-c-abi.md §2)",
        )
    log = call_log()
    functions: Any = log.wrap(cdll) if log is not None else cdll
    return CalrtLibrary(path=p, fn=functions, abi=(major.value, minor.value), extensions=frozenset(present))


def enumerate_devices(lib: CalrtLibrary) -> list[str] | None:
    """The CALRT_DEVICE values of the boards the shim lists (``calrt_ext_device_count``/``_name``), or None when
    it does not export both. A failing call or a count past :data:`MAX_ENUMERATED`: LibraryError naming it."""
    if not all(lib.has(n) for n in ENUMERATION_CALLS):
        return None
    count = c_uint32()
    rc = lib.fn.calrt_ext_device_count(ctypes.byref(count))
    if rc != 0:
        raise LibraryError(f"CalRT library {lib.path}: calrt_ext_device_count failed: {lib.status_string(rc)}")
    if count.value > MAX_ENUMERATED:
        raise LibraryError(
            f"CalRT library {lib.path}: calrt_ext_device_count says {count.value} boards, more than the "
            f"{MAX_ENUMERATED} calctl reads"
        )
    names: list[str] = []
    for i in range(count.value):
        buf = ctypes.create_string_buffer(EXT_ID_LEN)
        rc = lib.fn.calrt_ext_device_name(i, buf, EXT_ID_LEN)
        if rc != 0:
            raise LibraryError(f"CalRT library {lib.path}: calrt_ext_device_name({i}) failed: {lib.status_string(rc)}")
        raw = buf.raw
        if b"\0" not in raw:
            raise LibraryError(f"CalRT library {lib.path}: calrt_ext_device_name({i}) left its name unterminated")
        name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        if not name or not name.isprintable():
            raise LibraryError(f"CalRT library {lib.path}: calrt_ext_device_name({i}) gave {name!r}, not a device name")
        names.append(name)
    return names
