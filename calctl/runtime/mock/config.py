"""The simulated board's shape: :class:`MockBoardConfig` (docs/runtime.md).

Chips, CalCores and DRAM per chip, the timing model and its scale, the host link's transfer model, the
modelled global runtime lock, the fault plan, the reset scopes the board grants, and how much it keeps (queue
depth, history). A value: it is checked when made (``ConfigError`` naming the field) and simulates nothing (:mod:`.board` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calctl.errors import ConfigError
from calctl.runtime.history import history_bytes_from_env
from calctl.runtime.mock.faults import FaultPlan
from calctl.runtime.mock.memory import TransferModel
from calctl.runtime.mock.thermal import ThermalModel
from calctl.runtime.mock.timing import TimingModel
from calctl.runtime.types import ResetScope

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class MockBoardConfig:
    """The simulated board. Defaults: 2 chips x 2 CalCores x 16 GiB (the reference board class, 001 §3)."""

    chips: int = 2
    calcores_per_chip: int = 2
    chip_dram_bytes: int = 16 * GIB
    firmware_reserved_bytes: int = 64 * MIB  # per chip, in use before any calbin: the memory baseline
    timing: TimingModel = field(default_factory=TimingModel)
    time_scale: float = 1.0
    serialize_chips: bool = False
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    seed: int | None = None  # overrides the fault plan's seed
    reset_scopes: tuple[ResetScope, ...] = (ResetScope.CHIP, ResetScope.BOARD)
    max_queue_depth: int = 64  # per chip, queued + running; beyond it submit raises DeviceBusy
    history: int = 65536  # trace events (one per chip of a finished job) kept for wait/query/trace, at most
    # ... and at most this many bytes of host memory for them (calctl.runtime.history; $CALCTL_JOB_HISTORY_MIB)
    history_bytes: int = field(default_factory=history_bytes_from_env)
    transfer: TransferModel = field(default_factory=TransferModel)  # write_mem/read_mem (docs/runtime.md §8)
    thermal: ThermalModel = field(default_factory=ThermalModel)  # telemetry (docs/runtime.md §9)

    def __post_init__(self) -> None:
        if not 1 <= self.chips <= 16:
            raise ConfigError(f"mock board: chips must be 1..16, got {self.chips}")
        if self.calcores_per_chip < 1:
            raise ConfigError(f"mock board: calcores_per_chip must be >= 1, got {self.calcores_per_chip}")
        if self.chip_dram_bytes < self.firmware_reserved_bytes or self.firmware_reserved_bytes < 0:
            raise ConfigError("mock board: chip_dram_bytes must hold firmware_reserved_bytes")
        if not self.time_scale >= 0:
            raise ConfigError(f"mock board: time_scale must be >= 0, got {self.time_scale}")
        if self.max_queue_depth < 1 or self.history < 16:
            raise ConfigError("mock board: max_queue_depth must be >= 1 and history >= 16")
        if self.history_bytes < MIB:
            raise ConfigError(f"mock board: history_bytes must be >= 1 MiB ({MIB}), got {self.history_bytes}")
        if not self.reset_scopes:
            raise ConfigError("mock board: at least one reset scope (board) must be granted")
        self.fault_plan.check_board(self.chips)  # a rule on a chip the board lacks never fires
