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
}


@dataclass(frozen=True)
class CalrtLibrary:
    """A loaded, checked shim. ``fn`` is the CDLL whose functions all carry argtypes/restype."""

    path: Path
    fn: ctypes.CDLL
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
        raise LibraryError(
            "no CalRT library given",
            hint="pass --calrt-lib PATH or set CALRT_LIBRARY to the CalRT C-ABI shim (docs/calrt-c-abi.md)",
        )
    p = Path(path)
    if not p.is_file():
        raise LibraryError(f"CalRT library {p}: no such file", hint="check --calrt-lib / CALRT_LIBRARY")
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
    return CalrtLibrary(path=p, fn=cdll, abi=(major.value, minor.value), extensions=frozenset(present))
