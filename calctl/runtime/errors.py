"""Typed runtime errors, one per runtime status code (docs/runtime.md, docs/calrt-c-abi.md).

Every error the runtime layer raises is a :class:`RuntimeLayerError`, itself a
:class:`calctl.errors.DeviceError` (exit 3), carrying the runtime's own status
code in ``status`` so a bench log lines up with the vendor's logs. The codes are
the C ABI's ``calrt_status`` values; the mock board raises the same classes with
the same codes, so callers never care which backend they talk to.

:func:`error_for_status` is the one status -> exception table. This module does
not talk to a device and does not decide when an error happens.
"""

from __future__ import annotations

import enum
from typing import ClassVar

from calctl.errors import DeviceError


class RuntimeStatus(enum.IntEnum):
    """``calrt_status`` values of the C ABI (docs/calrt-c-abi.md §4). 0 is success."""

    OK = 0
    DEVICE_BUSY = 1
    TIMEOUT = 2
    ALREADY_CONFIGURED = 3
    NOT_CONFIGURED = 4
    INVALID_CALBIN = 5
    OUT_OF_MEMORY = 6
    CCU_EXCEPTION = 7
    UNKNOWN_DMA_STATE = 8
    DEVICE_LOST = 9
    INVALID_ARGUMENT = 10
    DEVICE_IN_USE = 11
    BUFFER_IN_USE = 12
    NOT_SUPPORTED = 13
    JOB_ABORTED = 14
    INTERNAL = 99
    #: Not a runtime code: the library itself could not be loaded or is incompatible.
    LIBRARY = -1


class RuntimeLayerError(DeviceError):
    """Base of every runtime-layer error. ``job`` names the job when one is involved."""

    code: ClassVar[RuntimeStatus] = RuntimeStatus.INTERNAL

    def __init__(
        self, message: str, *, job: int | None = None, hint: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message, status=int(self.code) if status is None else status, hint=hint)
        self.job = job


class DeviceBusy(RuntimeLayerError):
    """The runtime refused the call for now (queue full, job in flight); back off and retry (001 §11.3)."""

    code = RuntimeStatus.DEVICE_BUSY


class Timeout(RuntimeLayerError):
    """``wait`` ran out of time. The job stays in flight and keeps owning its buffers."""

    code = RuntimeStatus.TIMEOUT


class AlreadyConfigured(RuntimeLayerError):
    """``configure`` while a calbin is current (0.7.6: one current calbin, 001 §2.4)."""

    code = RuntimeStatus.ALREADY_CONFIGURED


class NotConfigured(RuntimeLayerError):
    """The call needs a configured calbin and there is none."""

    code = RuntimeStatus.NOT_CONFIGURED


class InvalidCalbin(RuntimeLayerError):
    """The calbin is unusable on this device: names, chip targets, masks or I/O contract (001 §6.4)."""

    code = RuntimeStatus.INVALID_CALBIN


class OutOfMemory(RuntimeLayerError):
    """A chip's DRAM (or the KV manager's sequences) cannot hold what was asked (001 §8)."""

    code = RuntimeStatus.OUT_OF_MEMORY


class CcuException(RuntimeLayerError):
    """A CalCore raised an exception while running a job; the chip needs a reset (001 §11.3)."""

    code = RuntimeStatus.CCU_EXCEPTION


class UnknownDmaState(RuntimeLayerError):
    """A job ended with DMA in an unknown state; its buffers stay owned until a reset (001 §9.1)."""

    code = RuntimeStatus.UNKNOWN_DMA_STATE


class DeviceLost(RuntimeLayerError):
    """The chip or board is unusable until a reset of the right scope."""

    code = RuntimeStatus.DEVICE_LOST


class InvalidArgument(RuntimeLayerError):
    """A call's arguments are wrong (unknown graph, wrong buffer, KV binding mismatch). Nothing was submitted."""

    code = RuntimeStatus.INVALID_ARGUMENT


class DeviceInUse(RuntimeLayerError):
    """The physical device is already open in this process (0.7.6: one physical device, 001 §2.1)."""

    code = RuntimeStatus.DEVICE_IN_USE


class BufferInUse(RuntimeLayerError):
    """A buffer is owned by a job in flight (or by a job whose DMA state is unknown)."""

    code = RuntimeStatus.BUFFER_IN_USE


class NotSupported(RuntimeLayerError):
    """The runtime cannot do this (e.g. a chip-scoped reset on a runtime without one)."""

    code = RuntimeStatus.NOT_SUPPORTED


class JobAborted(RuntimeLayerError):
    """The job was dropped by a reset or by a fault that halted its chip before it ran."""

    code = RuntimeStatus.JOB_ABORTED


class InternalRuntimeError(RuntimeLayerError):
    """The runtime reported an internal error or an undocumented status code."""

    code = RuntimeStatus.INTERNAL


class LibraryError(RuntimeLayerError):
    """The CalRT C-ABI library is missing, not loadable, lacks a symbol, or has an incompatible ABI."""

    code = RuntimeStatus.LIBRARY


_BY_STATUS: dict[int, type[RuntimeLayerError]] = {
    cls.code: cls
    for cls in (
        DeviceBusy,
        Timeout,
        AlreadyConfigured,
        NotConfigured,
        InvalidCalbin,
        OutOfMemory,
        CcuException,
        UnknownDmaState,
        DeviceLost,
        InvalidArgument,
        DeviceInUse,
        BufferInUse,
        NotSupported,
        JobAborted,
        InternalRuntimeError,
    )
}


def error_class(status: int) -> type[RuntimeLayerError]:
    """The exception class for a non-zero status; unknown codes are internal errors."""
    return _BY_STATUS.get(int(status), InternalRuntimeError)


def error_for_status(status: int, message: str, *, job: int | None = None) -> RuntimeLayerError:
    """Build the typed error for ``status`` (never called with OK)."""
    if status == RuntimeStatus.OK:
        raise ValueError("error_for_status(OK): success is not an error")
    cls = error_class(status)
    name = RuntimeStatus(status).name if status in RuntimeStatus._value2member_map_ else f"status {status}"
    return cls(f"{message} ({name})", job=job, status=int(status))
