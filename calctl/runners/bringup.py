"""``calctl bringup``: the bench pipeline in one command (001 §12 Phases 1–3, §17 gates; 000 §18).

The pipeline is an explicit tuple of :class:`BringupStep` values, run in order:

============  ==========================================  =======================
step          what                                        needs
============  ==========================================  =======================
device-check  the board ready? (calctl device check);     –; not ready stops the
              every level                                 pipeline, reason first
conformance   the vendor library against every ABI        device-check; --device
              promise (calctl device conformance at the   calrt only
              pipeline's level)
selftest      transfers and memory patterns               device-check; standard
              (calctl device selftest)                    and long only
burn-in       both chips at full load, telemetry against  device-check; long only
              limits (calctl burn-in; minutes by level)
validate      static validation (calctl validate)          –
budget        per-chip capacity GO/NO-GO (gate G0, §8)     validate
run-golden    every model's golden on the device           validate, budget
warmup        warm-up latency and stability                run-golden
poc           the combined-calbin PoC (§6.4), S1/S2         run-golden; only for a combined or replica package
soak          a short load/unload soak with mixed traffic  warmup
              (``calctl soak``, 001 §13.3; cycles by level)
============  ==========================================  =======================

The board comes first (:mod:`calctl.runners.board_steps`, issue 51 item 6): a
board that is not ready stops the pipeline at ``device-check`` (every later
step SKIP, "not run: the board is not ready: chip 1: wrong answer ..."), since
nothing about the model is worth measuring there; a self-test or burn-in FAIL
is a FAIL step and the pipeline goes on; a self-test or burn-in NOT JUDGED (no
board profile, a figure the runtime does not report) is reported as such and
does not turn the verdict.

A step whose needs did not pass is reported SKIP with the reason (never
dropped); a step that does not apply (the PoC on a single-model package) is
SKIP with that reason too. A failing step makes the verdict FAIL; the exit
code is the first failing step's (1 fail, 3 device error, 4 timeout, 130
Ctrl-C, which also stops the pipeline).

Extension point: :data:`STEPS` is the pipeline. A new stage (like the short soak
of ``calctl soak``) is one more :class:`BringupStep` appended to it, with its
``needs``; :func:`run_bringup` also takes ``steps=`` so a caller can run a
different pipeline. Nothing else has to change: rendering and the report loop
over whatever steps ran.

Everything goes to one directory: ``<step>.trace.json`` / ``<step>.png`` for
the device steps, written here, and ``report.json`` (:class:`~calctl.report.Report`,
every step's own report embedded), written by the CLI with the one JSON
renderer. This module does not print.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from calctl import records
from calctl.budget.builders import plan_from_package
from calctl.budget.evaluation import report_document, run_budget
from calctl.budget.policy import BudgetPolicy
from calctl.errors import CalctlError, Interrupted, interrupt_reason, reason_of
from calctl.package.model import Package
from calctl.package.reader import load_manifest, package_root
from calctl.package.validate import ValidationPolicy, validate
from calctl.report import Report, StepRecord, StepStatus, build_header, exit_code_of, step_status_of
from calctl.runners.board_steps import (
    BURNIN,
    BURNIN_HOW,
    CHECK,
    CONFORMANCE,
    CONFORMANCE_HOW,
    SELFTEST,
    SELFTEST_HOW,
    BoardStepResult,
    board_figures,
    burnin_skip_reason,
    conformance_skip_reason,
    run_board_burnin,
    run_board_conformance,
    run_board_selftest,
    run_check,
    selftest_skip_reason,
)
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Opening, Run, RunState, RunStep, drive, write_pictures
from calctl.runners.golden import run_golden
from calctl.runners.poc import run_poc_combined
from calctl.runners.steps import RunOutcome, StepNote, error_text, outcome_of
from calctl.runners.warmup import describe as describe_warmup
from calctl.runners.warmup import run_warmup
from calctl.signing.policy import TrustPolicy

log = logging.getLogger("calctl.bringup")


class Level(str, enum.Enum):
    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"


@dataclass(frozen=True)
class BringupSettings:
    """How much one bring-up ``--level`` runs (acceptance has its own, :class:`calctl.runners.acceptance.plan.LevelSettings`)."""

    warmup_iterations: int
    poc_rounds: int
    step_timeout_s: float
    soak_cycles: int  # load/unload cycles of the short soak
    soak_traffic_s: float  # seconds of mixed traffic per soak cycle
    poc_max_rounds: int = 0  # the PoC's round budget while an interval straddles its gate (0: 4 x poc_rounds)
    burnin_minutes: float = 0.0  # minutes both chips run at full load (0: the level runs no burn-in)


#: One row a level: warm-up iterations, PoC rounds, step timeout, soak cycles, seconds of traffic a cycle, the
#: PoC's round budget, the burn-in's minutes (long only: 10 min heats a chip to its steady state, about as long
#: as the level's 100 soak cycles take; ``--burn-in-minutes`` overrides it).
LEVELS: dict[Level, BringupSettings] = {
    Level.QUICK: BringupSettings(5, 4, 30.0, 3, 0.5, 16),
    Level.STANDARD: BringupSettings(20, 8, 30.0, 5, 1.0, 32),
    Level.LONG: BringupSettings(200, 30, 60.0, 100, 2.0, 120, burnin_minutes=10.0),
}


@dataclass(frozen=True)
class BringupConfig:
    package: Path
    trust: TrustPolicy
    device: DeviceSpec
    level: Level
    out_dir: Path
    #: The command the pictures are titled with: ``bringup``, or ``accept`` when acceptance runs these steps.
    command: str = "bringup"
    #: A ``calculet-board-profile/v1`` file the self-test judges its transfer rows against (None: NOT JUDGED).
    board_profile: Path | None = None
    #: The burn-in's minutes at a level that runs one (None: the level's own, :data:`LEVELS`).
    burnin_minutes: float | None = None

    @property
    def settings(self) -> BringupSettings:
        s = LEVELS[self.level]
        return s if self.burnin_minutes is None else replace(s, burnin_minutes=self.burnin_minutes)


@dataclass(frozen=True)
class StepOutcome:
    """One pipeline step in the summary: verdict, the one figure a person looks at first, duration.

    The step decides its verdict; its exit code is :func:`calctl.report.exit_code_of` that verdict (under
    ``fail_on``, the policy of the runner's own report), never set by hand.
    """

    name: str
    verdict: str  # PASS | WARN | FAIL | TIMEOUT | ERROR | INTERRUPTED | INTERNAL ERROR | SKIP, GO / NO-GO, S1 / S2
    key_figure: str
    seconds: float
    detail: str = ""
    files: dict[str, str | None] = field(default_factory=dict)
    document: dict[str, Any] | None = None  # the step's own report
    fail_on: frozenset[str] = frozenset()  # the verdicts the step's own run fails on (its report's policy)

    @property
    def exit_code(self) -> int:
        """The verdict's exit code (docs/cli.md); a SKIP step did not fail: 0."""
        if self.verdict == StepStatus.SKIP.value:
            return 0
        return exit_code_of(self.verdict, fail_on=self.fail_on)

    def to_dict(self) -> dict[str, Any]:
        """The step as the report lists it (``steps``; ``summary`` has the same rows keyed ``step``)."""
        return {
            "name": self.name,
            "status": self.status.value,  # the step word every command's steps use (docs/cli.md)
            "verdict": self.verdict,  # the step's own word: GO, S2, WARN ...
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "key_figure": self.key_figure,
            "exit_code": self.exit_code,
            "files": self.files,
        }

    @property
    def status(self) -> StepStatus:
        if self.verdict == StepStatus.SKIP.value:
            return StepStatus.SKIP
        return step_status_of(self.verdict, fail_on=self.fail_on)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and self.verdict not in ("SKIP", "FAIL", "ERROR", "TIMEOUT", "INTERRUPTED")

    @property
    def failed(self) -> bool:
        return self.exit_code != 0


@dataclass
class BringupState:
    """What earlier steps leave for later ones (the loaded package, the device header)."""

    config: BringupConfig
    stack: ExitStack
    package: Package | None = None
    outcomes: dict[str, StepOutcome] = field(default_factory=dict)
    header: dict[str, Any] | None = None  # from the first device step: device, runtime version, digest, signer


@dataclass(frozen=True)
class BringupStep:
    """A pipeline stage. ``applies`` returns None when the step applies, else the reason it does not."""

    name: str
    needs: tuple[str, ...]
    run: Callable[[BringupState], StepOutcome]
    applies: Callable[[BringupState], str | None] = lambda state: None
    #: A failure of this step stops the pipeline (the board is not ready): every later step is SKIP saying so.
    stops: bool = False
    #: Its NOT JUDGED makes the pipeline WARN (a PoC not judged); False: its figures are reported, the verdict
    #: does not turn on them (the self-test without a board profile).
    not_judged_warns: bool = True


# ---------------------------------------------------------------------------
# The steps


def _board_outcome(state: BringupState, r: BoardStepResult) -> StepOutcome:
    if state.header is None and isinstance(r.document.get("runtime"), dict):
        state.header = {"runtime": r.document["runtime"]}  # the device said what it is: the header says it too
    files: dict[str, str | None] = {"json": str(r.path) if r.path else None}
    if r.plot is not None:
        files["plot"] = str(r.plot)
    return StepOutcome(r.name, r.verdict, r.key_figure, r.seconds, r.detail, files, r.document)


def _device_check(state: BringupState) -> StepOutcome:
    cfg = state.config
    return _board_outcome(state, run_check(cfg.device, cfg.out_dir, step_timeout_s=cfg.settings.step_timeout_s))


def _selftest(state: BringupState) -> StepOutcome:
    cfg = state.config
    return _board_outcome(state, run_board_selftest(cfg.device, cfg.out_dir, board_profile=cfg.board_profile))


def _selftest_applies(state: BringupState) -> str | None:
    why = selftest_skip_reason(state.config.level.value)
    return None if why is None else f"{why} (to run it: {SELFTEST_HOW})"


def _conformance(state: BringupState) -> StepOutcome:
    cfg = state.config
    return _board_outcome(state, run_board_conformance(cfg.device, cfg.out_dir, level=cfg.level.value))


def _conformance_applies(state: BringupState) -> str | None:
    why = conformance_skip_reason(state.config.device)
    return None if why is None else f"{why} (to run it: {CONFORMANCE_HOW})"


def _burnin(state: BringupState) -> StepOutcome:
    cfg = state.config
    return _board_outcome(
        state,
        run_board_burnin(cfg.device, cfg.out_dir, minutes=cfg.settings.burnin_minutes, board_profile=cfg.board_profile),
    )


def _burnin_applies(state: BringupState) -> str | None:
    why = burnin_skip_reason(state.config.level.value)
    return None if why is None else f"{why} (to run it: {BURNIN_HOW})"


def _validate(state: BringupState) -> StepOutcome:
    cfg = state.config
    t0 = time.perf_counter()
    report = validate(cfg.package, ValidationPolicy(trust=cfg.trust))
    if report.ok:
        root = state.stack.enter_context(package_root(cfg.package))
        state.package = load_manifest(root)
    warned = list(dict.fromkeys(c.id for c in report.warnings))
    figure = f"{len(report.rule_ids())} rules, {len(report.errors)} failing, {len(report.warnings)} warning(s)"
    detail = (
        f"{cfg.package}: the package failed validation ({report.refusal()})"  # rule, file, figure (#53 item 6)
        if not report.ok
        # each warning with its file and why (``warnings SIG002`` alone meant nothing to a reader, #53 item 1)
        else ("warnings: " + "; ".join(_warning_lines(report)) if warned else "every rule passed")
    )
    return StepOutcome("validate", report.verdict, figure, time.perf_counter() - t0, detail, document=report.to_dict())


def _warning_lines(report: Any, limit: int = 3) -> list[str]:
    lines = [f"{c.id} {c.file}: {c.message}" if c.file else f"{c.id}: {c.message}" for c in report.warnings]
    return lines[:limit] + ([f"and {len(lines) - limit} more"] if len(lines) > limit else [])


def _budget(state: BringupState) -> StepOutcome:
    assert state.package is not None
    t0 = time.perf_counter()
    report = run_budget(plan_from_package(state.package), BudgetPolicy())
    tight = max(report.chips, key=lambda c: c.budget.static_bytes / c.budget.dram_bytes)
    b = tight.budget
    figure = (
        f"tightest chip {b.chip}: static {b.static_bytes / b.dram_bytes:.1%} of DRAM "
        f"(limit {b.limit_bytes / b.dram_bytes:.0%})"
    )
    detail = "; ".join(f"chip {c.budget.chip} {c.budget.verdict.value}" for c in report.chips)
    return StepOutcome(
        "budget",
        report.verdict.value,
        figure,
        time.perf_counter() - t0,
        detail,
        document=report_document(report),
    )


def _device_step(state: BringupState, name: str, report: Report, figure: str) -> StepOutcome:
    cfg = state.config
    out = cfg.out_dir
    files = write_pictures(
        report, trace=out / f"{name}.trace.json", plot=out / f"{name}.png", title=f"calctl {cfg.command}: {name}"
    )
    if state.header is None and report.header.get("runtime") is not None:
        state.header = dict(report.header)
    verdict = report.verdict
    detail = report.error or ""
    warned = [s for s in report.steps or () if isinstance(s, StepRecord) and s.status is StepStatus.WARN]
    if verdict == RunOutcome.PASS.value and any(s.name.startswith(("golden", "warmup")) for s in warned):
        verdict = "WARN"
    if verdict == "WARN" and not detail:  # a WARN says why, as validate's does
        detail = "; ".join(f"{s.name}: {s.detail}" if s.detail else s.name for s in warned)
    doc = report.with_body(trace=files).document()
    return StepOutcome(name, verdict, figure, report.seconds or 0.0, detail, files, doc, report.fail_on)


def _run_on_device(state: BringupState, runner: Callable[..., Report], **options: Any) -> Report:
    """One device runner (golden, warm-up, PoC) on the bring-up's package, trust and device, with its step timeout."""
    cfg = state.config
    return runner(
        cfg.package, trust=cfg.trust, device=cfg.device, step_timeout_s=cfg.settings.step_timeout_s, **options
    )


def _golden(state: BringupState) -> StepOutcome:
    report = _run_on_device(state, run_golden)
    models = report.body.get("models", [])
    figure = f"{sum(1 for r in models if r.ok)}/{len(models)} model(s) exact"
    return _device_step(state, "run-golden", report, figure)


def _warmup(state: BringupState) -> StepOutcome:
    report = _run_on_device(state, run_warmup, iterations=state.config.settings.warmup_iterations)
    results = report.body.get("models", [])
    figure = "; ".join(_decode_p50(state, r) for r in results) or "no result"
    outcome = _device_step(state, "warmup", report, figure)
    return replace(outcome, detail=outcome.detail or " | ".join(describe_warmup(r) for r in results))


def _decode_p50(state: BringupState, r: Any) -> str:
    decode = state.package.model(r.alias).decode.name if state.package else None
    p = r.graphs.get(decode)
    if p is not None and p.p50 is not None:
        return f"{r.alias} decode P50 {p.p50 * 1e3:.2f} ms"
    return f"{r.alias}: {r.errors} error(s)"


def _poc_applies(state: BringupState) -> str | None:
    pkg = state.package
    if pkg is None:
        return "no package loaded"
    if pkg.kind not in ("combined", "replica") or len(pkg.models) != 2:
        return f"the package is {pkg.kind} with {len(pkg.models)} model(s); the PoC needs a combined or replica package"
    return None


def _poc(state: BringupState) -> StepOutcome:
    s = state.config.settings
    assert state.package is not None
    report = _run_on_device(
        state,
        run_poc_combined,
        expect_models=state.package.aliases,
        rounds=s.poc_rounds,
        max_rounds=s.poc_max_rounds or None,
    )
    o, e = report.body.get("overlap_ratio"), report.body.get("throughput_efficiency")
    if o and e and o.get("mean") is not None and e.get("mean") is not None:
        figure = f"overlap {o['mean']:.2f} [{_f(o['ci_low'])}, {_f(o['ci_high'])}], efficiency {e['mean']:.2f}"
    else:
        figure = "no verdict"
    outcome = _device_step(state, "poc", report, figure)
    reasons = report.body.get("reasons") or []
    return replace(outcome, detail=outcome.detail or "; ".join(reasons))


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _soak(state: BringupState) -> StepOutcome:
    """A short ``calctl soak``: load/unload cycles under mixed traffic, its evidence in ``<report>/soak/``."""
    from calctl.runners.soak import SoakConfig, run_soak

    cfg = state.config
    s = cfg.settings
    t0 = time.perf_counter()
    out = cfg.out_dir / "soak"
    report = run_soak(
        SoakConfig(
            cfg.package,
            cfg.trust,
            cfg.device,
            out,
            cycles=s.soak_cycles,
            traffic_seconds=s.soak_traffic_s,
            job_timeout_s=s.step_timeout_s,
        )
    )
    doc = report.document()
    violations = doc["violations"]
    drift = doc["memory"]["max_drift_bytes"]
    from calctl.runners.soak.wording import SHORT_MEANING, RequestCounts

    figure = (
        f"{doc['cycles']}/{s.soak_cycles} cycles, requests {RequestCounts.of_report(doc['requests']).short()}, "
        f"{len(violations)} violation(s), max drift "
        + ", ".join(f"chip{c} {'n/a' if v is None else f'{v / 2**20:+.1f} MiB'}" for c, v in sorted(drift.items()))
    )
    detail = (
        "; ".join(v["message"] for v in violations[:3]) or "memory back to baseline, counters closed, no stale token"
    ) + f". {SHORT_MEANING}"  # a PASS beside more refused than succeeded, explained (#53 item 7)
    verdict = report.verdict
    said = doc.get("interrupted")
    if verdict == RunOutcome.INTERRUPTED.value and isinstance(said, dict) and said.get("signal"):
        phase = said.get("phase")
        where = "after its last cycle" if phase == "done" else f"in its {phase} phase"
        detail = f"{interrupt_reason(Interrupted(str(said['signal'])))} {where}; {detail}"
    files = {
        "json": str(out / "soak-report.json"),
        "plot": doc["files"].get("plot"),
        "events": str(out / "events.ndjson"),
    }
    return StepOutcome("soak", verdict, figure, time.perf_counter() - t0, detail, files, doc, report.fail_on)


DEVICE_CHECK = BringupStep(CHECK, (), _device_check, stops=True)
CONFORMANCE_STEP = BringupStep(CONFORMANCE, (CHECK,), _conformance, _conformance_applies)
SELFTEST_STEP = BringupStep(SELFTEST, (CHECK,), _selftest, _selftest_applies, not_judged_warns=False)
BURNIN_STEP = BringupStep(BURNIN, (CHECK,), _burnin, _burnin_applies, not_judged_warns=False)
VALIDATE = BringupStep("validate", (), _validate)
BUDGET = BringupStep("budget", ("validate",), _budget)
GOLDEN = BringupStep("run-golden", ("validate", "budget"), _golden)
WARMUP = BringupStep("warmup", ("run-golden",), _warmup)
POC = BringupStep("poc", ("run-golden",), _poc, _poc_applies)
SOAK = BringupStep("soak", ("warmup",), _soak)

#: The pipeline, in order. Extension point: later stages are appended here.
STEPS: tuple[BringupStep, ...] = (
    DEVICE_CHECK,
    CONFORMANCE_STEP,
    SELFTEST_STEP,
    BURNIN_STEP,
    VALIDATE,
    BUDGET,
    GOLDEN,
    WARMUP,
    POC,
    SOAK,
)


# ---------------------------------------------------------------------------
# The pipeline


def default_report_dir(now: datetime | None = None) -> Path:
    return records.default_report_dir("bringup", now)


def run_bringup(
    config: BringupConfig,
    *,
    steps: tuple[BringupStep, ...] = STEPS,
    on_step: Callable[[StepOutcome], None] | None = None,
) -> Report:
    """Run ``steps`` in order, traces and plots into ``config.out_dir``. Ctrl-C (or SIGTERM) in a step, between
    two steps or in the teardown ends the pipeline with a report (the remaining steps SKIP), so the caller can
    still write ``report.json``."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    pipeline = _Pipeline(config, steps, on_step)
    declared = [RunStep(step.name, pipeline.stage(step), logged=False) for step in steps]
    return drive(Run("bringup", config.device, declared, pipeline.report, opening=Opening.NONE))


@dataclass
class _Pipeline:
    """The bring-up's steps as the driver runs them: each one's outcome, and what stopped the others."""

    config: BringupConfig
    steps: tuple[BringupStep, ...]
    on_step: Callable[[StepOutcome], None] | None
    state: BringupState = field(init=False)
    done: list[StepOutcome] = field(default_factory=list)
    cut: str | None = None  # what stopped the pipeline: the signal, and where it came
    error: str | None = None  # the report's one line on it
    stopped: str | None = None  # a board that is not ready: why the remaining steps did not run

    def __post_init__(self) -> None:
        self.state = BringupState(config=self.config, stack=ExitStack())

    def stage(self, step: BringupStep) -> Callable[[RunState, StepNote], None]:
        def body(s: RunState, note: StepNote) -> None:
            if not self.done:
                s.hold(self.state.stack)  # the package the steps loaded, released at the end of the run
            outcome = _run_step(step, self.state, self.cut, self.stopped)
            if outcome.verdict == RunOutcome.INTERRUPTED.value and self.cut is None:
                self.cut = f"{_signal_text(outcome)} in {step.name}"
                self.error = f"{step.name}: {outcome.detail}"
            elif step.stops and outcome.failed and self.stopped is None:
                # said once in full on the step's own row; the steps it stopped name it
                self.stopped = f"the board is not ready ({step.name} {outcome.verdict})"
            self.state.outcomes[step.name] = outcome
            self.done.append(outcome)
            if self.on_step is not None:
                self.on_step(outcome)

        return body

    def report(self, s: RunState, ended: Ended) -> Report:
        steps, done = self.steps, self.done
        if ended.stopped and self.cut is None:
            # Between two steps or in the teardown (the live line, closing the device): the run is interrupted all
            # the same, and what the finished steps measured is still the report's. No step was running, so none
            # is INTERRUPTED: the report still says which signal it was, and where it came.
            where = (
                f"before {steps[0].name} started"
                if not done
                else f"after {done[-1].name}, the last step"
                if len(done) == len(steps)
                else f"after {done[-1].name}, before {steps[len(done)].name} started"
            )
            self.cut = self.error = f"{ended.error} {where}"
        for step in steps[len(done) :]:
            skipped = StepOutcome(step.name, "SKIP", "", 0.0, f"not run: the pipeline was {self.cut}")
            done.append(skipped)
            if self.on_step is not None:
                self.on_step(skipped)
        failing = [o for o in done if o.failed]
        if self.cut is not None:
            verdict = RunOutcome.INTERRUPTED.value
        elif failing:
            verdict = _pipeline_verdict(failing[0])
        elif any(
            o.verdict in ("WARN", "S1") or (o.verdict == "NOT JUDGED" and _not_judged_warns(steps, o)) for o in done
        ):
            verdict = "WARN"  # a PoC (or a gate) not judged is not a pass: WARN, and its step says why
        else:
            verdict = "PASS"
        return Report(
            "bringup",
            verdict,
            _header(self.config, self.state, s.started_at),
            _body(self.config, done),
            steps=tuple(done),
            reasons=_stopped_reasons(done, self.stopped),
            error=self.error if self.cut is not None else next((f"{o.name}: {o.detail}" for o in failing), None),
            seconds=time.perf_counter() - s.t0,
            evidence={"report": str(self.config.out_dir / "report.json")},
        )


def _body(config: BringupConfig, done: list[StepOutcome]) -> dict[str, Any]:
    return {
        "report_dir": str(config.out_dir),
        "summary": [
            {
                "step": s.name,
                "verdict": s.verdict,
                "key_figure": s.key_figure,
                "seconds": round(s.seconds, 3),
                "detail": s.detail,
                "files": s.files,
            }
            for s in done
        ],
        "step_reports": {s.name: s.document for s in done if s.document is not None},
        # each device step's per-chip power, temperature, throttle and ECC (calctl.runners.telemetry)
        "telemetry": {
            s.name: _without_series(s.document["telemetry"])  # the burn-in's samples: in step_reports
            for s in done
            if isinstance(s.document, dict) and isinstance(s.document.get("telemetry"), dict)
        },
        # the board steps' figures (readiness, self-test rows, burn-in rows and telemetry), as accept's
        "board": board_figures(*(_board_document(done, name) for name in (CHECK, SELFTEST, BURNIN, CONFORMANCE))),
    }


#: The words a step ends with that the pipeline's verdict keeps: how the run went (docs/cli.md "Verdicts").
#: Any other failing word (FAIL, a gate's NO-GO, a finding the step's policy fails) is a failed check: FAIL.
_RUN_ENDINGS = ("ERROR", "TIMEOUT", "INTERRUPTED", "INTERNAL ERROR")


def _stopped_reasons(done: list[StepOutcome], stopped: str | None) -> tuple[str, ...]:
    """A board that is not ready: the steps it stopped in one line, not one line each (the report's ``error``, said
    first, names the chip and why)."""
    if stopped is None:
        return ()
    skipped = [s.name for s in done if s.verdict == "SKIP" and s.detail == f"not run: {stopped}"]
    return (f"{', '.join(skipped)} not run: {stopped}",) if skipped else ()


def _board_document(done: list[StepOutcome], name: str) -> dict[str, Any] | None:
    """The own report of board step ``name`` if it ran (None: it was skipped or did not run)."""
    o = next((s for s in done if s.name == name), None)
    return o.document if o is not None and o.verdict != "SKIP" and isinstance(o.document, dict) else None


def _without_series(telemetry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in telemetry.items() if k not in ("series", "t0_monotonic_s")}


def _not_judged_warns(steps: tuple[BringupStep, ...], outcome: StepOutcome) -> bool:
    """Does ``outcome``'s NOT JUDGED make the pipeline WARN? Yes, unless its step says its figures are reported
    without turning the verdict (the self-test without a board profile)."""
    return next((s.not_judged_warns for s in steps if s.name == outcome.name), True)


def _pipeline_verdict(first_failing: StepOutcome) -> str:
    """The pipeline's verdict when ``first_failing`` is its first failing step: that step's word where it says
    how the run went (ERROR, TIMEOUT, ...), else FAIL."""
    return first_failing.verdict if first_failing.verdict in _RUN_ENDINGS else RunOutcome.FAIL.value


def _signal_text(outcome: StepOutcome) -> str:
    """``interrupted (SIGTERM)``: the signal that interrupted ``outcome``'s step (a soak says it in its report)."""
    doc = outcome.document if isinstance(outcome.document, dict) else {}
    said = doc.get("interrupted")
    if isinstance(said, dict) and said.get("signal"):
        return interrupt_reason(Interrupted(str(said["signal"])))
    head = outcome.detail.split(";")[0]
    return head if head.startswith("interrupted (") else "interrupted"


def _run_step(step: BringupStep, state: BringupState, cut: str | None, stopped: str | None = None) -> StepOutcome:
    if cut is not None:
        return StepOutcome(step.name, "SKIP", "", 0.0, f"not run: the pipeline was {cut}")
    if stopped is not None:
        return StepOutcome(step.name, "SKIP", "", 0.0, f"not run: {stopped}")
    unmet = [n for n in step.needs if n not in state.outcomes or not state.outcomes[n].passed]
    if unmet:
        why = ", ".join(f"{n} {state.outcomes[n].verdict if n in state.outcomes else 'did not run'}" for n in unmet)
        return StepOutcome(step.name, "SKIP", "", 0.0, f"skipped: needs {why}")
    reason = step.applies(state)
    if reason is not None:
        return StepOutcome(step.name, "SKIP", "", 0.0, f"does not apply: {reason}")
    t0 = time.perf_counter()
    try:
        return step.run(state)
    except KeyboardInterrupt as exc:
        return StepOutcome(step.name, RunOutcome.INTERRUPTED.value, "", time.perf_counter() - t0, error_text(exc))
    except CalctlError as exc:
        # A usage or input error here came up mid-run (a file the step reads changed or vanished): the step
        # is ERROR, naming the error, and what the other steps measured is kept.
        outcome = outcome_of(exc)
        detail = reason_of(exc)
        return StepOutcome(step.name, outcome.value, "", time.perf_counter() - t0, detail)
    except OSError as exc:  # a file the step writes (its report directory) is unusable
        what = f"{exc.filename}: " if exc.filename else ""
        detail = f"{what}{exc.strerror or exc}"
        return StepOutcome(step.name, RunOutcome.ERROR.value, "", time.perf_counter() - t0, detail)
    except Exception as exc:  # a calctl bug in one step: the report still says what the others measured
        log.exception("bringup step %s: internal error", step.name)
        return StepOutcome(
            step.name,
            "INTERNAL ERROR",
            "",
            time.perf_counter() - t0,
            f"internal error (a calctl bug): {type(exc).__name__}: {exc}",
        )


def _header(config: BringupConfig, state: BringupState, started: datetime) -> dict[str, Any]:
    h = state.header or {}
    validation = state.outcomes.get("validate")
    vdoc = validation.document if validation else None
    pkg = state.package
    burnin: dict[str, Any] = {}  # the burn-in's minutes, at the level that runs one
    if burnin_skip_reason(config.level.value) is None:
        burnin["burn_in_minutes"] = config.settings.burnin_minutes
    return build_header(
        "bringup",
        started_at=started,
        device=config.device.kind.value,
        device_options=config.device.describe(),
        versions=h.get("runtime"),
        package={
            "path": str(config.package),
            "name": pkg.name if pkg else None,
            "version": pkg.version if pkg else None,
            "kind": pkg.kind if pkg else None,
            "digest": vdoc.get("digest") if vdoc else None,
            "signer_key_id": vdoc.get("signer_key_id") if vdoc else None,
            **(
                {"not_validated": validation.detail.removeprefix("not run: ")}
                if validation and validation.verdict == "SKIP"
                else {}
            ),
        },
        level=config.level.value,
        **burnin,
    )


__all__ = [
    "BUDGET",
    "BURNIN_STEP",
    "DEVICE_CHECK",
    "GOLDEN",
    "LEVELS",
    "POC",
    "SELFTEST_STEP",
    "SOAK",
    "STEPS",
    "VALIDATE",
    "WARMUP",
    "BringupConfig",
    "BringupSettings",
    "BringupState",
    "BringupStep",
    "Level",
    "StepOutcome",
    "default_report_dir",
    "run_bringup",
]
