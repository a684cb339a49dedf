"""Scenario ``fault-isolation``, the plan: the phases' settings and classes, and what one phase records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calctl.runners.traffic import EngineResult
from calctl.serving.engine import ReloadResult

#: Default mock time scale: jobs long enough that host overhead does not dominate B's latency.
FAULT_ISOLATION_TIME_SCALE = 5.0
PHASE_MIN_S = 2.5
BASELINE_S = 3.0
PHASE_MAX_S = 30.0  # a phase whose B has fewer jobs than a P99 needs (a loaded host) runs on, at most this long
JOB_TIMEOUT_S = 1.0  # the engine core's Wait timeout (001 §11.3), short so a hang is seen quickly
LATENCY_GATE = 0.25  # B's P99 E2E may exceed its baseline by this much (001 §13.2)
A_WAITING = 4
B_CLIENTS = 2

Log = Callable[[str], None]

# The class of each phase: which grade a B impact there costs.
REQUEST, RUNTIME, LIFECYCLE = "request/resource", "runtime", "lifecycle"


@dataclass
class Phase:
    """One phase: what was injected on A, when, and what A, B and the engine did meanwhile."""

    name: str
    cls: str
    injected: str
    start: float = 0.0
    end: float = 0.0
    a_results: list[EngineResult] = field(default_factory=list)
    recoveries: list[Any] = field(default_factory=list)
    b_events: list[str] = field(default_factory=list)
    a_jobs: int = 0
    scope: str = ""
    note: str = ""
    reload: ReloadResult | None = None  # the supervisor's answer, for the lifecycle phases
    faults_fired: int = 0  # faults the mock injected during the phase
    b_device_s: list[float] = field(default_factory=list)  # B's jobs: end - submit on the device's clock
    scope_from_jobs: str = ""  # a scope text with {jobs}: filled with A's device jobs of the phase
