"""Scenario ``executor-modes``, the plan: the modes, the 000 §19 limits, the mock's phase profiles, the options
and one measured round."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calctl.errors import UsageError
from calctl.loadgen.client import RequestRecord
from calctl.runners.bench.base import OneModelOptions
from calctl.serving.config import ExecutorMode

Log = Callable[[str], None]

MODES = (ExecutorMode.SYNC, ExecutorMode.ASYNC, ExecutorMode.PINGPONG)
#: 000 §19 limits.
M1_P50_LIMIT = 0.03
M1_P99_LIMIT = 0.05
M2_GAIN_LIMIT = 0.10
M2_P99_LIMIT = 0.05
#: Default mock time scale: device time dominates host time (about 25 ms per decode job, ~1 ms of host work).
EXECUTOR_TIME_SCALE = 8.0


@dataclass(frozen=True)
class PhaseProfile:
    """The mock's h2d/compute/d2h split of every job (``GraphTiming.h2d_share``/``d2h_share``)."""

    name: str
    h2d_share: float
    d2h_share: float

    @property
    def compute_share(self) -> float:
        return 1.0 - self.h2d_share - self.d2h_share

    def label(self) -> str:
        return f"{self.name} ({self.h2d_share:.0%} h2d / {self.compute_share:.0%} compute / {self.d2h_share:.0%} d2h)"


TRANSFER_HEAVY = PhaseProfile("transfer-heavy", 0.3, 0.3)
COMPUTE_BOUND = PhaseProfile("compute-bound", 0.0, 0.0)


@dataclass(frozen=True)
class ExecutorModesOptions(OneModelOptions):
    profile: PhaseProfile | None = TRANSFER_HEAVY  # mock only; None: the mock's own default split
    rounds: int = 8
    max_rounds: int | None = None  # round budget while a milestone is inconclusive (None: 3 x rounds)
    warmup_rounds: int = 1
    concurrency: int = 5  # odd: with B1 and deadline-first decode the P50 request is a middle one, not a boundary
    prompt_tokens: int = 16
    output_tokens: int = 6
    seed: int = 0
    request_timeout_s: float = 60.0
    trace_path: Path | None = None  # Chrome trace of the last ping/pong round (with phases)
    plot_path: Path | None = None  # its timeline picture

    def __post_init__(self) -> None:
        if self.rounds < 2:
            raise UsageError("executor-modes needs at least 2 measured rounds (a confidence interval needs two)")
        if self.concurrency < 2:
            raise UsageError(
                "executor-modes needs at least 2 concurrent requests: one request never has two jobs in flight"
            )
        if self.output_tokens < 2 or self.prompt_tokens < 1:
            raise UsageError("executor-modes needs prompt_tokens >= 1 and output_tokens >= 2")


@dataclass
class ModeRound:
    """One round of one mode: ``concurrency`` identical requests sent together, their records and tokens."""

    mode: ExecutorMode
    index: int
    start_ns: int
    wall_s: float
    records: list[RequestRecord]
    tokens: list[list[int]]
    #: The round on the device's clock (None: the runtime stamps no job start/end): the time the chips were busy
    #: with the round's jobs (the union of their intervals), and per request the busy time from the round's start
    #: to its end (its E2E without the gaps in which the chips waited on the host; None for a failed request).
    device_busy_s: float | None = None
    device_e2e: list[float | None] | None = None

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens for r in self.records if r.ok)

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.records)
