"""The one table of ``calctl bench`` scenarios, and the option rules the CLI applies to the one chosen.

Adding a scenario (two files, docs/bench.md §7): write a module under ``calctl/runners/bench/`` with a function
``run(options: BenchOptions, log: Callable[[str], None]) -> ScenarioResult`` (types in
:mod:`calctl.runners.bench.base`, contract in its docstring) and a :class:`~calctl.runners.bench.base.Scenario`
value naming the options it reads; import it here and add it to :data:`SCENARIOS`. ``calctl bench --scenario
NAME`` finds it in this table, refuses the options it does not read by :func:`choose` and :func:`check_options`,
runs it, writes its report and renders its tables; the CLI knows no scenario by name.
"""

from __future__ import annotations

from collections.abc import Collection

from calctl.errors import UsageError
from calctl.runners.bench.ab import AB, INTERFERENCE
from calctl.runners.bench.base import Scenario
from calctl.runners.bench.batch import BATCH
from calctl.runners.bench.executor_modes import EXECUTOR_MODES
from calctl.runners.bench.fault_isolation import FAULT_ISOLATION
from calctl.runners.bench.isolation import ISOLATION
from calctl.runners.bench.sweep import SWEEP

#: name -> scenario, in --help order. The default scenario is the first.
SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (AB, INTERFERENCE, FAULT_ISOLATION, EXECUTOR_MODES, BATCH, ISOLATION, SWEEP)
}
DEFAULT_SCENARIO = "ab"

#: The options only a scenario that runs the engine in-process (on --device) takes.
IN_PROCESS_OPTIONS = ("PKG", "--device", "--time-scale", "--fault-plan")


def choose(name: str | None, given: Collection[str]) -> Scenario:
    """The scenario ``--scenario name`` names; without it, the one an option in ``given`` (the options given on
    the command line) selects, else the default. A usage error for an unknown name, or for a selecting option
    given to another scenario."""
    if name is None:
        name = next((s.name for s in SCENARIOS.values() if s.selected_by in given), DEFAULT_SCENARIO)
    chosen = SCENARIOS.get(name)
    if chosen is None:
        raise UsageError(f"--scenario {name!r}: expected one of {', '.join(SCENARIOS)}")
    for other in SCENARIOS.values():
        if other.selected_by in given and other is not chosen:
            raise UsageError(f"{other.selected_by} belongs to --scenario {other.name}, not {name}")
    return chosen


def _takers(option: str) -> str:
    return " and ".join(s.name for s in SCENARIOS.values() if s.reads(option))


def check_options(chosen: Scenario, given: Collection[str]) -> None:
    """A usage error for an option in ``given`` that ``chosen`` cannot run with: a server scenario takes no
    device options, an in-process one no --url; --requests and --fault-plan only where a scenario reads them."""
    if "--requests" in given and not chosen.reads("--requests"):
        raise UsageError(
            f"--requests applies to --scenario {_takers('--requests')} only (use --max-requests for {chosen.name})"
        )
    if chosen.needs_url and any(o in given for o in IN_PROCESS_OPTIONS):
        raise UsageError(
            f"--scenario {chosen.name} drives the server at --url: {', '.join(IN_PROCESS_OPTIONS[:-1])} and "
            f"{IN_PROCESS_OPTIONS[-1]} do not apply"
        )
    if not chosen.needs_url and "--url" in given:
        raise UsageError(f"--scenario {chosen.name} runs the engine in-process: --url does not apply")
    if not chosen.needs_url and "--fault-plan" in given and not chosen.reads("--fault-plan"):
        raise UsageError(f"--fault-plan applies to --scenario {_takers('--fault-plan')}, not to {chosen.name}")
    if "--sweep-levels" in given and "--sweep" not in given:
        raise UsageError("--sweep-levels needs --sweep concurrency|rate")


__all__ = ["DEFAULT_SCENARIO", "IN_PROCESS_OPTIONS", "SCENARIOS", "check_options", "choose"]
