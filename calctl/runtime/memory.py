"""Direct device-memory access, an optional part of a runtime: :class:`DeviceMemory` (docs/runtime.md §8).

CalRT 0.7.6's headers carry ``ReadMem``/``WriteMem`` with a chip id (001 §2.3); the calctl C ABI 1.0 has no
such call, so a runtime offers this only where it can: the mock board does; a CalRT shim would through the
optional ``calrt_read_mem``/``calrt_write_mem`` (not in ABI 1.0: a shim without them is UNSUPPORTED, C4,
in ``calctl device selftest``, never a pass). ``calctl device selftest`` uses it to measure host<->device
transfers on the device's own clock.

Every transfer returns a :class:`MemTransfer` with the DMA's start and end on the device's clock (the
runtime's stamps, like a job's, docs/runtime.md "Job timestamps"), or None when the runtime cannot stamp it:
a bandwidth is judged only from those stamps, never from the host's clock.

This module declares; it implements nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


class TransferDirection(str, enum.Enum):
    H2D = "h2d"  # write_mem: host -> device
    D2H = "d2h"  # read_mem: device -> host


@dataclass(frozen=True)
class MemTransfer:
    """One transfer. ``start_ns``/``end_ns``: the DMA on the device's clock (``time.monotonic_ns`` domain), or
    None when the runtime does not stamp transfers (a figure from them is then never judged)."""

    chip: int
    direction: TransferDirection
    bytes: int
    start_ns: int | None
    end_ns: int | None

    @property
    def device_seconds(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9


@runtime_checkable
class DeviceMemory(Protocol):
    """Per-chip device memory a self-test may write and read (0.7.6 ``WriteMem``/``ReadMem`` with a chip id).

    Only the window :meth:`test_window` names may be touched, and only while no calbin is configured: it is
    memory a calbin's plan would use. Errors are the runtime's (``InvalidArgument`` outside the window,
    ``DeviceBusy`` while configured, ``DeviceLost`` on a halted chip)."""

    def test_window(self, chip: int) -> tuple[int, int]:
        """``(address, bytes)`` of the chip's memory a self-test may overwrite."""
        ...

    def write_mem(self, chip: int, address: int, data: np.ndarray) -> MemTransfer:
        """Copy ``data`` (bytes, uint8) to ``chip`` at ``address``; returns when the DMA is done."""
        ...

    def read_mem(self, chip: int, address: int, out: np.ndarray) -> MemTransfer:
        """Fill ``out`` (uint8) from ``chip`` at ``address``; returns when the DMA is done."""
        ...


__all__ = ["DeviceMemory", "MemTransfer", "TransferDirection"]
