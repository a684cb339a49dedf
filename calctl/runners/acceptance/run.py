"""The acceptance run: the evidence steps in order, a checkpoint after each, the rows judged, the verdict.

Which steps there are and what they run: :mod:`~calctl.runners.acceptance.evidence`;
the levels and the configuration: :mod:`~calctl.runners.acceptance.plan`.

A step that does not apply (no replica package, ``--device calrt`` for a
mock-only scenario, a row not asked for with ``--only``) is SKIP with the
reason and what would make it apply; a step that raises is ERROR with the
error; Ctrl-C/SIGTERM makes the current and every later step INTERRUPTED.
After every step ``report.json`` is rewritten atomically with every row judged
from what is known so far, so a run that dies still leaves its report.

This module does not print; ``calctl.cli.accept_cmds`` renders.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from calctl import html_report, records
from calctl.errors import CalctlError, CheckFailed, ExitCode, raise_dropped_signal
from calctl.report import Report, StepStatus, build_header
from calctl.runners import telemetry
from calctl.runners.acceptance.evidence import STEPS, AcceptState, Skip, Step, error_evidence
from calctl.runners.acceptance.judges import judge_all
from calctl.runners.acceptance.plan import (
    JUNIT_FILE,
    LEVELS,
    PLOT_FILE,
    REPORT_FILE,
    AcceptConfig,
    Level,
    LevelSettings,
    default_report_dir,
)
from calctl.runners.acceptance.plot import plot_rows
from calctl.runners.acceptance.rows import GateDecision, RowResult, StepEvidence
from calctl.runners.acceptance.targets import ProjectTargets
from calctl.runners.board_steps import BURNIN, CHECK, CONFORMANCE, SELFTEST, board_figures
from calctl.runners.device import DeviceSpec
from calctl.runners.steps import error_text


def counts(rows: tuple[RowResult, ...]) -> dict[str, int]:
    return {v.value: sum(1 for r in rows if r.verdict is v) for v in GateDecision}


def summary_line(status: str, rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...] = ()) -> str:
    """``GO: 11 GO, 0 NO-GO, 0 NOT MEASURED`` or ``GO on 9 of 11 rows, 2 NOT MEASURED (G3, M4)``: the run's last
    line.

    GO only when a row is GO and no step failed to run: a refused package (PKG or ``--replica``), a calctl bug,
    a hung step and any other step in ERROR are said as such, and a run that measured no row reads NOT MEASURED
    (never "GO ... 0 GO")."""
    c = counts(rows)
    verdict = _verdict(status, rows, steps)
    errored = ", ".join(s.name for s in steps if s.status is StepStatus.ERROR) or "a step"
    refused = ", ".join(s.name for s in steps if s.status is StepStatus.ERROR and s.name in PACKAGE_STEPS)
    device = any(s.status is StepStatus.ERROR and _step_code(s) == int(ExitCode.DEVICE) for s in steps)
    board = board_failure(steps)
    head = {
        "RUNNING": "RUNNING",
        "INTERRUPTED": "INTERRUPTED",
        "NO-GO": "NO-GO",
        "FAIL": f"FAIL ({board})" if board else f"FAIL (the package failed validation: {refused})",
        "INTERNAL ERROR": f"INTERNAL ERROR (a calctl bug in {errored})",
        "TIMEOUT": f"TIMEOUT (a step hung past its deadline: {errored})",
        "ERROR": f"ERROR (device error in {errored})" if device else f"ERROR (a step could not run: {errored})",
    }.get(verdict)
    if head is None:
        head = "GO" if c[GateDecision.GO.value] else "NOT MEASURED"
    nm = [r.id for r in rows if r.verdict is GateDecision.NOT_MEASURED]
    ng = [r.id for r in rows if r.verdict is GateDecision.NO_GO]
    if head == "GO" and nm:  # the headline never says more than the rows (#53 item 3)
        return f"GO on {c['GO']} of {len(rows)} rows, {len(nm)} NOT MEASURED ({', '.join(nm)})"
    parts = [f"{c['GO']} GO"]
    parts.append(f"{c['NO-GO']} NO-GO" + (f" ({', '.join(ng)})" if ng else ""))
    parts.append(f"{c['NOT MEASURED']} NOT MEASURED" + (f" ({', '.join(nm)})" if nm else ""))
    return f"{head}: " + ", ".join(parts)


#: The steps that validate a package: their ERROR is the package refused (FAIL, exit 1).
PACKAGE_STEPS = frozenset({"validate", "validate-replica"})
#: What a row left unmeasured by a board that is not ready needs.
BOARD_HOW = "fix the board (`calctl device check` names the chip and why), then run `calctl accept` again"


def board_failure(steps: tuple[StepEvidence, ...] | list[StepEvidence]) -> str | None:
    """The board's own failure, in words, when a board step failed its check: the board not ready (the
    device check, which stopped the run), else every conformance, self-test and burn-in failure; else None. A board step
    in ERROR (no device) is a step that could not run, said as such by the verdict."""
    said = {
        CONFORMANCE: "the board's library failed ABI conformance",
        SELFTEST: "the board failed its self-test",
        BURNIN: "the board failed its burn-in",
    }
    failed = []
    for s in steps:
        if s.status is StepStatus.FAIL and s.name == CHECK:
            return f"the board is not ready: {s.detail}"
        if s.status is StepStatus.FAIL and s.name in said:
            failed.append(f"{said[s.name]}: {s.detail}")
    return "; ".join(failed) or None


def _step_code(step: StepEvidence) -> int | None:
    code = step.document.get("exit_code")
    return code if isinstance(code, int) else None


def _verdict(status: str, rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...]) -> str:
    """The run's verdict (docs/accept.md): its exit code is :func:`calctl.report.exit_code_of` it."""
    if status == "running":
        return "RUNNING"
    if status == "interrupted":
        return "INTERRUPTED"
    if board_failure(steps):
        return "FAIL"  # the board itself failed (not ready, a self-test row): before any row about the model
    if any(r.verdict is GateDecision.NO_GO for r in rows):
        return "NO-GO"
    failed = [s for s in steps if s.status is StepStatus.ERROR]
    if any(s.name in PACKAGE_STEPS for s in failed):
        return "FAIL"  # a refused package (PKG or --replica): what needed it could not be judged, a failed check
    if any(s.document.get("internal_error") for s in failed):
        return "INTERNAL ERROR"  # a calctl bug in a step: never a silent 0, never the usage code
    if any(_step_code(s) == int(ExitCode.TIMEOUT) for s in failed):
        return "TIMEOUT"  # a step hung past its deadline (the board needs a reset): exit 4, as for the runners
    if failed:
        return "ERROR"  # a device error, or any other step that could not run: never GO beside it
    if not any(r.verdict is GateDecision.GO for r in rows):
        return "NOT MEASURED"  # nothing was measured GO: never a GO verdict resting on no row (docs/accept.md §1)
    return "GO"


def _check_previous(cfg: AcceptConfig) -> None:
    """``--previous`` is refused before any step runs (the rollback step is the last one: after a 24 h soak at
    ``--level long``): it must validate under the run's trust policy and serve PKG's aliases (a rollback needs
    the same models, docs/accept.md "The rollback step"). Only when G5/M4 are asked for."""
    if cfg.previous is None or not cfg.wants("G5", "M4"):
        return
    from calctl.package.reader import load_manifest, package_root
    from calctl.package.validate import ValidationPolicy, validate

    try:
        with package_root(cfg.package) as root:
            aliases: tuple[str, ...] | None = tuple(load_manifest(root).aliases)
    except CalctlError:
        aliases = None  # PKG itself is refused by the validate step, with its own finding
    report = validate(cfg.previous, ValidationPolicy(trust=cfg.trust, expect_models=aliases))
    if not report.ok:
        first = report.errors[0] if report.errors else None
        why = f"{first.id}: {first.message}" if first else "refused"
        raise CheckFailed(
            f"--previous {cfg.previous}: the package failed validation ({why})"
            + (f"; PKG serves {', '.join(aliases)}" if aliases and first and first.id == "MAN004" else ""),
            hint="give the signed version PKG replaces, with the same models (`calctl validate` names every finding)",
        )


def run_accept(
    config: AcceptConfig,
    *,
    log: Callable[[str], None] = lambda line: None,
    on_step: Callable[[StepEvidence], None] | None = None,
    steps: tuple[Step, ...] = STEPS,
) -> Report:
    """Run ``steps`` in order into ``config.out_dir``; rewrite ``report.json`` after each; return the report.

    SIGINT/SIGTERM (a KeyboardInterrupt) ends the run with every later step INTERRUPTED and exit 130.
    """
    t0 = time.perf_counter()
    started = datetime.now(timezone.utc)
    _check_previous(config)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    _check_fault_plan(config.device)
    header = _header(config, started)
    interrupted: str | None = None
    stopped: str | None = None  # the board is not ready: nothing after the check is worth running (DCGM level 1)
    stack = ExitStack()
    state = AcceptState(config=config, stack=stack, log=log, telemetry_mark=telemetry.mark())
    try:
        with stack:
            for step in steps:
                if interrupted is not None:
                    ev = StepEvidence(step.name, StepStatus.INTERRUPTED, detail=f"not run: {interrupted}")
                elif stopped is not None:
                    ev = StepEvidence(
                        step.name, StepStatus.SKIP, detail=stopped, document={"how_to_measure": BOARD_HOW}
                    )
                elif not config.wants(*step.rows):
                    ev = StepEvidence(
                        step.name,
                        StepStatus.SKIP,
                        detail=f"not asked for: --only {','.join(sorted(config.only or ()))}",
                    )
                else:
                    log(f"step {step.name}")
                    ev = _run_step(step, state)
                    if ev.status is StepStatus.INTERRUPTED:
                        interrupted = ev.detail
                    elif step.name == CHECK and ev.status in (StepStatus.FAIL, StepStatus.ERROR):
                        # said in full on the check's own row and first on the page; the steps it stopped name it
                        stopped = f"the board is not ready ({CHECK} {ev.status.value})"
                state.steps[step.name] = ev
                if on_step is not None:
                    on_step(ev)
                _checkpoint(config, header, state, t0, "running" if interrupted is None else "interrupted", steps)
                if interrupted is None:
                    raise_dropped_signal()  # its raise was dropped (a GC callback): stop here all the same
    except KeyboardInterrupt as exc:  # a signal between steps (a checkpoint, the live line) or in the teardown
        interrupted = interrupted or error_text(exc)
        for step in steps:
            state.steps.setdefault(
                step.name, StepEvidence(step.name, StepStatus.INTERRUPTED, detail=f"not run: {interrupted}")
            )
    status = "interrupted" if interrupted is not None else "finished"
    return _checkpoint(config, header, state, t0, status, steps, final=True)


def _run_step(step: Step, state: AcceptState) -> StepEvidence:
    t0 = time.perf_counter()
    try:
        return step.run(state)
    except Skip as s:
        return StepEvidence(
            step.name, StepStatus.SKIP, detail=s.reason, document={"how_to_measure": s.how} if s.how else {}
        )
    except KeyboardInterrupt as exc:
        return StepEvidence(step.name, StepStatus.INTERRUPTED, time.perf_counter() - t0, detail=error_text(exc))
    except Exception as exc:  # a calctl bug in one step: the report still says what the others measured
        return error_evidence(step.name, exc, time.perf_counter() - t0)


def _judged(state: AcceptState, steps: tuple[Step, ...]) -> tuple[RowResult, ...]:
    rows = judge_all(dict(state.steps), state.out)  # a step not reached yet is absent: its rows say "not reached"
    if state.config.only is not None:
        rows = tuple(
            r
            if r.id in state.config.only
            else replace(
                r,
                verdict=GateDecision.NOT_MEASURED,
                key_figure="not asked for",
                reason=f"not asked for: --only {','.join(sorted(state.config.only))}",
                how_to_measure=f"`calctl accept` without --only, or --only {r.id}",
                action="",
            )
            for r in rows
        )
    return rows


def _checkpoint(
    config: AcceptConfig,
    header: dict[str, Any],
    state: AcceptState,
    t0: float,
    status: str,
    steps: tuple[Step, ...],
    *,
    final: bool = False,
) -> Report:
    rows = _judged(state, steps)
    if status == "interrupted":
        rows = tuple(
            replace(r, reason=f"interrupted: {r.reason}")
            if r.verdict is GateDecision.NOT_MEASURED and "interrupt" not in r.reason
            else r
            for r in rows
        )
    done = tuple(state.steps.values())
    status = status if final or status == "interrupted" else "running"
    runtime = (state.main.header or {}).get("runtime") if state.main is not None else None
    if runtime and header.get("device_label") == "unknown":  # the board said what it is once it was opened
        label = build_header("accept", device=header["device"], versions=runtime)
        header = {**header, **{k: label[k] for k in ("device_label", "note", "runtime")}}
    board = {
        name: state.steps[name].document
        for name in (CHECK, CONFORMANCE, SELFTEST, BURNIN)
        if name in state.steps and state.steps[name].status not in (StepStatus.SKIP, StepStatus.INTERRUPTED)
    }
    board_error = board_failure(done) or _board_not_run(done)
    report = Report(
        "accept",
        _verdict(status, rows, done),
        header,
        {
            "status": status,
            "summary": summary_line(status, rows, done),
            "counts": counts(rows),
            "report_dir": str(config.out_dir),
            "rows": [r.to_dict() for r in rows],
            "board": board_figures(
                board.get(CHECK) or None,
                board.get(SELFTEST) or None,
                board.get(BURNIN) or None,
                board.get(CONFORMANCE) or None,
            ),
            "files": {"report": REPORT_FILE, "plot": PLOT_FILE},
            # every device the steps opened: per-chip power, temperature, throttle, ECC (calctl.runners.telemetry)
            **({"telemetry": telemetry.documents_since(state.telemetry_mark)} if final else {}),
        },
        steps=done,
        reasons=_reasons(rows, done),
        error=board_error,
        seconds=time.perf_counter() - t0,
        evidence={"report": str(config.out_dir / REPORT_FILE), "junit": str(config.out_dir / JUNIT_FILE)},
        pictures={"plot": str(config.out_dir / PLOT_FILE)} if final else {},
    )
    if final:
        plot_rows(
            config.out_dir / PLOT_FILE,
            rows,
            title=f"calctl accept ({config.level.value}): {config.package.name}",
            device=config.device.kind.value,
        )
    document = report.document()
    records.write_json(config.out_dir / REPORT_FILE, document)
    if final or status == "interrupted":
        html_report.write(document, config.out_dir / REPORT_FILE)
    return report


def _reasons(rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...]) -> tuple[str, ...]:
    """Every reason the verdict rests on, for the page's first screen and the JSON (#53): a board that is not
    ready, said once; else the board's own steps that did not pass (a burn-in WARN names its figure, as its step
    row does), then every row that is not GO with why, what would measure it or the action."""
    stopped = _board_stop_reasons(rows, steps)
    if stopped:
        return stopped
    board = [s for s in steps if s.name in (CHECK, SELFTEST, BURNIN)]
    said = [_board_reason(s) for s in board if s.status not in (StepStatus.PASS, StepStatus.SKIP)]
    return (*said, *(_row_reason(r) for r in rows if r.verdict is not GateDecision.GO))


def _board_reason(step: StepEvidence) -> str:
    """``board burn-in WARN: <figure> — <what to look at>``, the words of the terminal's board line."""
    figure = step.key_figure or step.status.value
    return f"board {step.name} {step.status.value}: {figure}" + (f" — {step.detail}" if step.detail else "")


def _row_reason(r: RowResult) -> str:
    """``G2 NOT MEASURED: why. To measure: how`` or ``G1 NO-GO: what failed. Action: what to do``."""
    why = r.reason or r.condition or r.key_figure
    line = f"{r.id} {r.verdict.value}" + (f": {why}" if why else "")
    if r.how_to_measure:
        line += f". To measure: {r.how_to_measure}"
    if r.action and r.verdict is GateDecision.NO_GO:
        line += f". Action: {r.action}"
    return line


def _board_stop_reasons(rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...]) -> tuple[str, ...]:
    """A board that is not ready left every row unmeasured for one reason: said once (after the report's
    ``error``, which names the chip and why), not once a row."""
    check = next((s for s in steps if s.name == CHECK), None)
    if check is None or check.status not in (StepStatus.FAIL, StepStatus.ERROR):
        return ()
    ids = [r.id for r in rows if r.verdict is GateDecision.NOT_MEASURED]
    return (
        f"{', '.join(ids)} NOT MEASURED: the board is not ready ({CHECK} {check.status.value}), so nothing after "
        f"the check ran. To measure: {BOARD_HOW}",
    )


def _board_not_run(steps: tuple[StepEvidence, ...]) -> str | None:
    """The device check in ERROR (no device, the board held by another process): the reason first on the page."""
    check = next((s for s in steps if s.name == CHECK), None)
    if check is not None and check.status is StepStatus.ERROR:
        return f"{CHECK}: {check.detail}"
    return None


def _check_fault_plan(device: DeviceSpec) -> None:
    """A bad plan is a usage error before anything runs (exit 2), not an ERROR of every device step."""
    if device.fault_plan is not None:
        from calctl.runtime.mock.faults import FaultPlan

        FaultPlan.load(device.fault_plan)


def _header(config: AcceptConfig, started: datetime) -> dict[str, Any]:
    return build_header(
        "accept",
        started_at=started,
        device=config.device.kind.value,
        device_options=config.device.describe(),
        package=str(config.package),
        level=config.level.value,
        level_settings=config.settings,  # the level's, with --burn-in-minutes where given
        replica=str(config.replica) if config.replica else None,
        previous=str(config.previous) if config.previous else None,
        only=sorted(config.only) if config.only else None,
        targets=config.targets.to_dict() if config.targets else None,
        seed=config.seed,
    )


__all__ = [  # the plan's names too: ``calctl.cli.accept_cmds`` and callers read them here
    "JUNIT_FILE",
    "LEVELS",
    "PLOT_FILE",
    "REPORT_FILE",
    "STEPS",
    "AcceptConfig",
    "Level",
    "LevelSettings",
    "ProjectTargets",
    "Step",
    "counts",
    "default_report_dir",
    "run_accept",
    "summary_line",
]
