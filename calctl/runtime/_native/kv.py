"""The CalRT KV manager: :class:`calctl.runtime.interface.KvManager` over the ``calrt_kv_*`` functions.

calctl keeps no KV state for a CalRT device: every call goes to the shim (thread-safe, C ABI §8) outside the
device's bookkeeping lock, and a status becomes a typed error through the device's one choke point.
"""

from __future__ import annotations

from ctypes import byref, c_uint32, c_uint64
from typing import TYPE_CHECKING

from calctl.runtime.types import KvLength, KvSeqId

if TYPE_CHECKING:
    from calctl.runtime._native.backend import CalrtRuntime


class CalrtKvManager:
    """:class:`calctl.runtime.interface.KvManager` over the ``calrt_kv_*`` functions."""

    def __init__(self, rt: CalrtRuntime) -> None:
        self._rt = rt

    def _call(self, what: str, fn_name: str, *args: object) -> None:
        rt = self._rt
        with rt._unlocked_call():  # KV calls are thread-safe (C ABI §8): calctl keeps no KV state to guard
            rc = getattr(rt._fn, fn_name)(rt._dev, *args)
        rt._check(rc, what)

    def can_allocate(self, model: str, n: int = 1) -> bool:
        yes = c_uint32()
        self._call(f"kv can_allocate {model!r}", "calrt_kv_can_allocate", model.encode(), n, byref(yes))
        return bool(yes.value)

    def allocate(self, model: str) -> KvSeqId:
        seq = c_uint64()
        self._call(f"kv allocate {model!r}", "calrt_kv_allocate", model.encode(), byref(seq))
        return KvSeqId(seq.value)

    def append(self, seq: KvSeqId, n: int) -> int:
        pos = c_uint32()
        self._call(f"kv append to sequence {seq}", "calrt_kv_append", seq, n, byref(pos))
        return int(pos.value)

    def commit(self, seq: KvSeqId) -> KvLength:
        self._call(f"kv commit sequence {seq}", "calrt_kv_commit", seq)
        return self.length(seq)

    def rollback(self, seq: KvSeqId) -> KvLength:
        self._call(f"kv roll back sequence {seq}", "calrt_kv_rollback", seq)
        return self.length(seq)

    def remove_tokens_at_end(self, seq: KvSeqId, n: int) -> KvLength:
        self._call(f"kv remove {n} tokens from sequence {seq}", "calrt_kv_remove_tokens_at_end", seq, n)
        return self.length(seq)

    def free(self, seq: KvSeqId) -> None:
        self._call(f"kv free sequence {seq}", "calrt_kv_free", seq)

    def length(self, seq: KvSeqId) -> KvLength:
        committed, reserved = c_uint32(), c_uint32()
        self._call(f"kv length of sequence {seq}", "calrt_kv_length", seq, byref(committed), byref(reserved))
        return KvLength(committed=int(committed.value), reserved=int(reserved.value))
