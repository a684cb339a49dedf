"""The mock board: the default device (docs/runtime.md). See :mod:`calctl.runtime.mock.board`."""

from calctl.runtime.mock.board import MockRuntime, open_mock
from calctl.runtime.mock.config import MockBoardConfig
from calctl.runtime.mock.faults import FaultKind, FaultPlan, FaultRule, InjectedFault
from calctl.runtime.mock.timing import GraphTiming, TimingModel

__all__ = [
    "FaultKind",
    "FaultPlan",
    "FaultRule",
    "GraphTiming",
    "InjectedFault",
    "MockBoardConfig",
    "MockRuntime",
    "TimingModel",
    "open_mock",
]
