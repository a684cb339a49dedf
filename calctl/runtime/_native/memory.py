"""Device memory through the optional C ABI calls ``calrt_mem_window``/``calrt_write_mem``/``calrt_read_mem``.

docs/calrt-c-abi.md §14 (CalRT 0.7.6 WriteMem/ReadMem with a chip id, 001 §2.3). :class:`NativeMemory` is
the part of :class:`~calctl.runtime._native.backend.CalrtRuntime` that implements
:class:`calctl.runtime.memory.DeviceMemory`: a shim that exports all three calls gets real transfers with the
DMA's device-clock stamps; one that exports none (every vendor shim of the C ABI 1.0) or only some raises
:class:`NotSupported` naming what is missing, which ``calctl device selftest`` grades UNSUPPORTED (C4),
never a pass. The copies run without the runtime's lock (the C ABI's calls are thread-safe, §8), so both
chips transfer at once. This module converts and checks; it judges nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from contextlib import AbstractContextManager
from ctypes import byref, c_uint64
from typing import Any, Protocol

import numpy as np

from calctl.runtime._native import lib as L
from calctl.runtime.errors import InvalidArgument, NotSupported
from calctl.runtime.memory import MemTransfer, TransferDirection


class _Native(Protocol):
    """What the mixin needs of the runtime it is part of."""

    library: L.CalrtLibrary
    _fn: Any
    _dev: ctypes.c_void_p

    def _check(self, status: int, what: str, *, job: int | None = None) -> None: ...

    def _unlocked_call(self, *, blocking: bool = False) -> AbstractContextManager[None]: ...


class NativeMemory:
    """``DeviceMemory`` over the shim's optional memory calls (mixed into ``CalrtRuntime``)."""

    def test_window(self: _Native, chip: int) -> tuple[int, int]:
        _require(self.library)
        address, size = c_uint64(), c_uint64()
        with self._unlocked_call():
            self._check(
                self._fn.calrt_mem_window(self._dev, chip, byref(address), byref(size)), f"chip {chip} memory window"
            )
        return int(address.value), int(size.value)

    def write_mem(self: _Native, chip: int, address: int, data: np.ndarray) -> MemTransfer:
        return _transfer(self, chip, address, data, TransferDirection.H2D)

    def read_mem(self: _Native, chip: int, address: int, out: np.ndarray) -> MemTransfer:
        return _transfer(self, chip, address, out, TransferDirection.D2H)


def _require(library: L.CalrtLibrary) -> None:
    missing = [name for name in L.MEMORY_CALLS if not library.has(name)]
    if missing:
        raise NotSupported(
            f"CalRT library {library.path} does not export {', '.join(missing)}: no device memory access "
            "(optional calls, docs/calrt-c-abi.md §14)"
        )


def _transfer(rt: _Native, chip: int, address: int, buf: np.ndarray, direction: TransferDirection) -> MemTransfer:
    _require(rt.library)
    if (
        buf.dtype != np.uint8
        or buf.ndim != 1
        or not buf.flags.c_contiguous
        or (direction is TransferDirection.D2H and not buf.flags.writeable)
    ):
        raise InvalidArgument(f"chip {chip}: a transfer buffer is a contiguous, 1-D uint8 array")
    if address < 0 or chip < 0:
        raise InvalidArgument(f"chip {chip}, address {address:#x}: expected non-negative values")
    timing = L.CalrtMemTiming()
    call: Callable[..., int] = rt._fn.calrt_write_mem if direction is TransferDirection.H2D else rt._fn.calrt_read_mem
    with rt._unlocked_call():  # it returns on its own: close() waits for it, no reset needed
        status = call(rt._dev, chip, address, buf.ctypes.data, buf.size, byref(timing))
    rt._check(
        status,
        f"{'write to' if direction is TransferDirection.H2D else 'read from'} chip {chip} memory at {address:#x}",
    )
    stamped = timing.start_ns and timing.end_ns >= timing.start_ns
    return MemTransfer(
        chip,
        direction,
        int(buf.size),
        int(timing.start_ns) if stamped else None,
        int(timing.end_ns) if stamped else None,
    )


__all__ = ["NativeMemory"]
