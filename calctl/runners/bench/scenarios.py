"""The one table of ``calctl bench`` scenarios.

Adding a scenario: write a module under ``calctl/runners/bench/`` with a
function ``run(options: BenchOptions, log: Callable[[str], None]) ->
ScenarioResult`` (types in :mod:`calctl.runners.bench.base`, contract in its
docstring), define a :class:`~calctl.runners.bench.base.Scenario` value there,
import it here and add it to :data:`SCENARIOS`. ``calctl bench --scenario NAME``
and ``--help`` pick it up from this table; nothing else changes.
"""

from __future__ import annotations

from calctl.runners.bench.ab import run_ab, run_interference
from calctl.runners.bench.base import Scenario
from calctl.runners.bench.batch import BATCH
from calctl.runners.bench.executor_modes import EXECUTOR_MODES
from calctl.runners.bench.fault_isolation import run_fault_isolation
from calctl.runners.bench.isolation import ISOLATION
from calctl.runners.bench.sweep import SWEEP

AB = Scenario(
    "ab",
    "A and B isolated and/or joint per --mode; 001 §13.2 overlap, efficiency, P99 and B-success gates",
    run_ab,
    needs_url=True,
    options=(
        "--url",
        "--models",
        "--mode",
        "--rate",
        "--duration",
        "--burstiness",
        "--prompt-len",
        "--output-len",
        "--slo-ttft",
        "--slo-tpot",
    ),
)
INTERFERENCE = Scenario(
    "interference",
    "the four prefill/decode pairs of 001 §9.4, each isolated vs joint",
    run_interference,
    needs_url=True,
    options=("--url", "--models", "--rate", "--duration", "--burstiness"),
)
FAULT_ISOLATION = Scenario(
    "fault-isolation",
    "faults injected on A in-process on the mock, B measured throughout: F0/F1/F2 (001 §13.4)",
    run_fault_isolation,
    needs_url=False,
    options=("PKG", "--models", "--time-scale", "--fault-plan"),
)

#: name -> scenario, in --help order. The default scenario is the first.
SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (AB, INTERFERENCE, FAULT_ISOLATION, EXECUTOR_MODES, BATCH, ISOLATION, SWEEP)
}
DEFAULT_SCENARIO = "ab"

__all__ = ["DEFAULT_SCENARIO", "SCENARIOS"]
