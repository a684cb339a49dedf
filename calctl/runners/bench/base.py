"""What every ``calctl bench`` scenario receives and returns.

A scenario is a :class:`Scenario` value registered in the one table
:data:`calctl.runners.bench.scenarios.SCENARIOS`. Its ``run`` has this signature::

    def run(options: BenchOptions, log: Callable[[str], None]) -> ScenarioResult

* ``options`` – every ``calctl bench`` option, parsed (target URL and models,
  rate, duration, length distributions, SLOs, seed, report directory; for
  in-process scenarios the package, trust policy and device spec);
* ``log`` – one line of progress for people (the CLI sends it to stderr);
* the result carries the scenario's verdict, the gates, tables for people, a
  JSON body for machines and the picture it wrote (in ``options.out_dir``): the
  body of a :class:`~calctl.report.Report`.
  :func:`calctl.runners.bench.bench_report.scenario_report` makes that report
  (the CLI's ``bench-report.json``, accept's step files): its exit code is
  :func:`calctl.report.exit_code_of` the verdict, and nothing else's.

A scenario raises :class:`~calctl.errors.UsageError` for options it cannot run
with (exit 2). Nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.errors import Interrupted, interrupt_reason
from calctl.loadgen.dataset import Dataset
from calctl.loadgen.metrics import Slo
from calctl.loadgen.workload import LengthDist, TokenRange
from calctl.runners.bench.gates import Gate
from calctl.runners.device import DeviceSpec
from calctl.signing.policy import TrustPolicy


class Mode(str, enum.Enum):
    ISOLATED = "isolated"  # each model alone
    JOINT = "joint"  # all models together
    ALL = "all"  # A isolated, B isolated, A+B joint, then the 001 §13.2 comparison


@dataclass(frozen=True)
class OneModelOptions:
    """Where an in-process scenario measuring one model of a package starts (batch, executor-modes); the scenario's
    options add their own fields after these."""

    package: Path
    trust: TrustPolicy
    alias: str | None = None  # default: the package's first model
    device: DeviceSpec = DeviceSpec()


@dataclass(frozen=True)
class BenchOptions:
    out_dir: Path
    url: str | None = None
    models: tuple[str, ...] = ()
    mode: Mode = Mode.ALL
    rate: float = 4.0  # requests/s per model
    duration_s: float = 10.0  # arrival period of one phase
    burstiness: float = 1.0
    prompt: LengthDist = field(default_factory=lambda: LengthDist.parse("uniform:8:64"))
    output: LengthDist = field(default_factory=lambda: LengthDist.parse("uniform:8:48"))
    slo: Slo = Slo()
    seed: int = 0
    max_requests: int = 10000  # per model and phase
    request_timeout_s: float = 60.0
    window_s: float | None = None  # None: metrics.default_window(duration)
    token_range: TokenRange = TokenRange()
    temperature: float = 1.0
    api_key: str | None = None
    rounds: int | None = None  # measured rounds of a round-based scenario (executor-modes); None: its default
    max_rounds: int | None = None  # its round budget while a gate is undecided (the decision rule); None: its default
    target_device: str = "unknown"  # what the operator says the server runs on (labels the report, docs/runtime.md §5)
    # In-process scenarios (the engine on a device of our own):
    package: Path | None = None
    trust: TrustPolicy | None = None
    device: DeviceSpec | None = None
    requests: int = 1000  # isolation: requests of the concurrent run, over both aliases (001 §13.1: >= 1000)
    # The load generator's inputs beyond synthetic ids (docs/bench.md "Datasets", "Sweeps"):
    dataset: Dataset | None = None  # --dataset: prompts (text, ids or chats) from a local file
    output_given: bool = False  # --output-len was given: it overrides a dataset's own output lengths
    max_concurrency: int | None = None  # --max-concurrency: at most N requests in flight per phase
    sweep: str | None = None  # --sweep concurrency|rate
    sweep_levels: tuple[float, ...] | None = None  # --sweep-levels; None: the sweep's default ladder

    @property
    def grace_s(self) -> float:
        """How long a phase waits for its last requests after the arrival period."""
        return min(self.request_timeout_s, max(5.0, self.duration_s))


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def ms_cell(x: float | None) -> str:
    """Seconds as a table cell in milliseconds: ``12.3 ms`` (``n/a`` when not measured)."""
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


@dataclass(frozen=True)
class ScenarioResult:
    """What a scenario measured and decided: a verdict and the body of its report (no exit code: the report's)."""

    scenario: str
    verdict: str  # PASS | FAIL | MEASURED | NOT JUDGED | INTERRUPTED, GO | NO-GO (G2), or the grade F0 | F1 | F2
    gates: tuple[Gate, ...] = ()
    tables: tuple[Table, ...] = ()
    body: dict[str, Any] = field(default_factory=dict)
    plot: Path | None = None
    notes: tuple[str, ...] = ()
    mock_result: bool | None = None  # True: produced on the mock device; None: unknown (a remote server)


class ScenarioInterrupted(Interrupted):
    """SIGINT/SIGTERM during a scenario, carrying what it had finished: ``partial`` is the report of the
    finished phases (verdict INTERRUPTED, exit 130, its picture written). Raised ``from`` the interrupt."""

    def __init__(self, interrupt: KeyboardInterrupt, partial: ScenarioResult) -> None:
        super().__init__(interrupt.signal_name if isinstance(interrupt, Interrupted) else "SIGINT")
        self.partial = partial


def interrupted_result(
    scenario: str, interrupt: KeyboardInterrupt, stopping: Exception | None, target_device: str
) -> ScenarioResult:
    """The result of a run that ``interrupt`` stopped: the scenario's report so far when it kept one
    (:class:`ScenarioInterrupted`), else verdict INTERRUPTED with nothing judged. ``stopping`` is an error raised
    while unwinding from the interrupt (a stream posting into a closed loop): the notes name it."""
    partial = interrupt.partial if isinstance(interrupt, ScenarioInterrupted) else None
    notes = (
        list(partial.notes)
        if partial is not None
        else [f"{interrupt_reason(interrupt)} before the scenario finished: nothing was judged"]
    )
    if stopping is not None:
        notes.append(f"while stopping: {type(stopping).__name__}: {stopping}")
    if partial is not None:
        return dataclasses.replace(partial, notes=tuple(notes))
    return ScenarioResult(
        scenario, "INTERRUPTED", notes=tuple(notes), mock_result={"mock": True, "calrt": False}.get(target_device)
    )


def interrupted_note(interrupt: KeyboardInterrupt, running: str, finished: Sequence[str]) -> str:
    """``interrupted (SIGTERM) in phase joint: nothing was judged; finished phase(s) reported: ...``"""
    kept = f"finished phase(s) reported: {', '.join(finished)}" if finished else "no phase had finished"
    where = f" in phase {running}" if running else ""
    return f"{interrupt_reason(interrupt)}{where}: nothing was judged; {kept}"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[BenchOptions, Callable[[str], None]], ScenarioResult]
    needs_url: bool  # True: drives a server at --url; False: runs the engine in-process on --device
    options: Sequence[str] = ()  # the options it reads, for --help and docs
    selected_by: str | None = None  # an option that chooses this scenario when --scenario is not given
    # In-process scenarios without PKG: the bundled sample to run (``calctl.compiler.bundled.bundled_package``
    # name: "combined", "replica"), or None when the scenario builds the package it needs (batch's B1/B4/B8/B16).
    default_package: str | None = "combined"

    def reads(self, option: str) -> bool:
        """Whether the scenario takes ``option`` (the CLI refuses the options a scenario does not read)."""
        return option in self.options


__all__ = [
    "BenchOptions",
    "Mode",
    "Scenario",
    "ScenarioInterrupted",
    "ScenarioResult",
    "Table",
    "interrupted_note",
    "interrupted_result",
    "ms_cell",
]
