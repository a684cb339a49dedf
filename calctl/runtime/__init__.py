"""The runtime layer: one :class:`Runtime` interface over the mock board and CalRT (docs/runtime.md).

``open_runtime`` is the one factory the CLI, the runners and the serving engine
use. It opens the device; use the result as a context manager so the device is
released on every path. This package does not schedule requests or decide
verdicts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from calctl.runtime.buffers import BufferState, Direction, HostBuffer
from calctl.runtime.calbin import Calbin
from calctl.runtime.errors import RuntimeLayerError, RuntimeStatus
from calctl.runtime.interface import FaultInjecting, KvManager, Runtime
from calctl.runtime.selection import BoardSelection, select_board
from calctl.runtime.types import (
    ChipCounters,
    ChipHealth,
    ChipMemory,
    DeviceKind,
    Engine,
    GenerationId,
    Health,
    Job,
    JobId,
    JobResult,
    JobState,
    KvLength,
    KvSeqId,
    ResetScope,
    Topology,
    TraceEvent,
    Versions,
)

#: Environment variable naming the CalRT C-ABI shim library (also ``--calrt-lib``).
CALRT_LIBRARY_ENV = "CALRT_LIBRARY"


def open_runtime(
    kind: DeviceKind | str = DeviceKind.MOCK, calrt_lib: Path | str | None = None, **mock_options: Any
) -> Runtime:
    """Open the device of ``kind``.

    ``mock``: ``mock_options`` are :class:`calctl.runtime.mock.MockBoardConfig`
    fields (``chips``, ``time_scale``, ``serialize_chips``, ``fault_plan`` (a
    FaultPlan or a YAML path), ``seed``, ...); ``select_board(kind).mock_options()``
    gives the ones the environment asks for (``CALCTL_MOCK_SEED``).
    ``calrt``: ``calrt_lib`` or ``$CALRT_LIBRARY`` names the shim library; a
    missing or incompatible one raises LibraryError (exit 3) naming the path
    and the missing symbol.
    """
    try:
        device = DeviceKind(kind)
    except ValueError:
        from calctl.errors import UsageError

        raise UsageError(f"device {kind!r}: expected mock or calrt") from None
    if device is DeviceKind.MOCK:
        from calctl.runtime.mock.board import open_mock

        if calrt_lib is not None:
            from calctl.errors import UsageError

            raise UsageError("--calrt-lib applies to --device calrt only")
        return open_mock(**mock_options)
    if mock_options:
        from calctl.errors import UsageError

        raise UsageError(f"mock options {sorted(mock_options)} do not apply to --device calrt")
    from calctl.runtime._native.backend import open_calrt

    path = calrt_lib if calrt_lib is not None else os.environ.get(CALRT_LIBRARY_ENV)
    return open_calrt(path)


__all__ = [
    "CALRT_LIBRARY_ENV",
    "BoardSelection",
    "BufferState",
    "Calbin",
    "ChipCounters",
    "ChipHealth",
    "ChipMemory",
    "DeviceKind",
    "Direction",
    "Engine",
    "FaultInjecting",
    "GenerationId",
    "Health",
    "HostBuffer",
    "Job",
    "JobId",
    "JobResult",
    "JobState",
    "KvLength",
    "KvManager",
    "KvSeqId",
    "ResetScope",
    "Runtime",
    "RuntimeLayerError",
    "RuntimeStatus",
    "Topology",
    "TraceEvent",
    "Versions",
    "open_runtime",
    "select_board",
]
