"""``calctl accept``: the acceptance report, gates G0–G5 and milestones M0–M4, from evidence (docs/accept.md).

Thin: options into an :class:`~calctl.runners.acceptance.run.AcceptConfig`,
run it, render the rows as a table, one JSON document or JUnit XML (one
testcase per row: NO-GO a failure, NOT MEASURED skipped with the reason).
``report.json``, ``accept.png`` and ``accept.junit.xml`` are always written to
the report directory. No judgement lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.padding import Padding

from calctl.cli import _output
from calctl.cli._boards import FLEET_DEFAULTS, FleetArgs, board_options, run_on_boards
from calctl.cli._device import (
    DEVICE_DEFAULTS,
    DeviceArgs,
    check_board_profile,
    check_burnin_minutes,
    device_options,
    report_dir,
)
from calctl.cli._logs import quiet_engine_log
from calctl.cli._options import (
    ACCEPT_TIME_SCALE_HELP,
    BoardProfileOpt,
    BurnInMinutesOpt,
    ResultFormatOpt,
    RunLevel,
    report_dir_option,
)
from calctl.cli._output import Format
from calctl.cli._package_arg import PackageArg
from calctl.cli._signals import interruptible
from calctl.errors import UsageError
from calctl.report import Report

if TYPE_CHECKING:  # the acceptance run loads every runner (numpy, the rules, matplotlib): only when accept runs
    from calctl.runners.acceptance.rows import StepEvidence

LevelOpt = Annotated[
    RunLevel,
    typer.Option(
        "--level",
        help="quick (CI, minutes on the mock) | standard (a bench session) | long (the report's 24 h soak, "
        ">= 100 cycles, 8 h switching). docs/accept.md, levels.",
    ),
]
ReplicaOpt = Annotated[
    Path | None,
    typer.Option(
        "--replica",
        help="A replica package (one model on both chips) for G2, and for G1/G3/G4 when PKG lacks a chip or a "
        "second model. Not needed when PKG is a replica package.",
    ),
]
PreviousOpt = Annotated[
    Path | None,
    typer.Option(
        "--previous",
        help="The version PKG replaces (same models): G5/M4's rollback serves it, rolls forward to PKG and back "
        "in one call under traffic. Without it the rollback is NOT MEASURED.",
    ),
]
TargetsOpt = Annotated[
    Path | None,
    typer.Option(
        "--targets",
        help="A YAML file of the project's targets: M3's fill ratio, throughput gain over B1 and P99 "
        "regression (docs/accept.md, 'Project targets'). Without it M3 is NOT MEASURED: calctl sets no target "
        "of its own.",
    ),
]
OnlyOpt = Annotated[
    str | None,
    typer.Option("--only", help="Measure only these rows, e.g. G3,G4 (the others are NOT MEASURED, not asked for)."),
]


def _parse_only(only: str | None) -> frozenset[str] | None:
    if only is None:
        return None
    ids = frozenset(x.strip().upper() for x in only.split(",") if x.strip())
    return ids


@device_options("fault_plan", "time_scale", "serialize_chips", "seed", time_scale=ACCEPT_TIME_SCALE_HELP)
@board_options
def accept(
    pkg: PackageArg = None,
    replica: ReplicaOpt = None,
    previous: PreviousOpt = None,
    level: LevelOpt = RunLevel.QUICK,
    only: OnlyOpt = None,
    targets: TargetsOpt = None,
    report: Annotated[
        Path | None,
        report_dir_option(
            "./calctl-reports/accept-<timestamp>",
            "report.json (rewritten after every step), accept.png, accept.junit.xml and every step's evidence",
        ),
    ] = None,
    board_profile: BoardProfileOpt = None,
    burn_in_minutes: BurnInMinutesOpt = None,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    format: ResultFormatOpt = Format.table,
    fleet: FleetArgs = FLEET_DEFAULTS,
) -> int:
    """Acceptance report: gates G0–G5 and milestones M0–M4, each GO, NO-GO or NOT MEASURED from evidence.

    Gates from 001 §17, milestones from 000 §19 (docs/accept.md).

    Runs the device check first (a board that is not ready stops the run there: FAIL naming the chip), the
    self-test at standard and long (NOT JUDGED without --board-profile; a FAIL row fails the run), the
    burn-in at long (30 min, or --burn-in-minutes; a FAIL row fails the run, naming figure, chip and limit), then
    budget, load peak, golden, the combined PoC, the isolation, fault-isolation, executor-modes and batch
    scenarios, a soak and (with --previous) a roll forward from that version to PKG and back under traffic,
    keeping every trace, record and picture in the report directory, and judges each row from them. Nothing
    is GO without its evidence file there; a duration or count not reached (24 h, 100 cycles) is NOT MEASURED
    with what was reached.

    With no PKG: the bundled combined sample (and the bundled replica for G2) on the mock device.
    Exit 0 no row NO-GO (NOT MEASURED rows allowed, named in the summary), 1 a row NO-GO or a refused
    package, 2 usage, 3 device error, 130 SIGINT/SIGTERM (the partial report is written).
    """
    from calctl.records import write_atomic
    from calctl.runners.acceptance import run as accept_lib

    check_burnin_minutes(burn_in_minutes, level.value)  # before any board runs: refused once, not per board
    if fleet.boards is not None:  # one child calctl per board, then the fleet report (docs/boards.md)
        return run_on_boards(fleet, "accept", dev, report=report, format=format)

    spec = dev.spec()
    path, trust, bundled = dev.package(pkg)
    if not path.exists():
        raise UsageError(f"PKG {path}: no such package directory or archive")
    if replica is not None and not replica.exists():
        raise UsageError(f"--replica {replica}: no such package directory or archive")
    if previous is not None and not previous.exists():
        raise UsageError(f"--previous {previous}: no such package directory or archive")
    if replica is None and bundled:
        from calctl.compiler.bundled import bundled_package

        replica = bundled_package("replica")
    check_board_profile(board_profile)
    project_targets = accept_lib.ProjectTargets.load(targets) if targets is not None else None
    out_dir = report_dir(report, "accept")
    config = accept_lib.AcceptConfig(
        package=path,
        trust=trust,
        device=spec,
        level=accept_lib.Level(level.value),
        out_dir=out_dir,
        replica=replica,
        only=_parse_only(only),
        seed=dev.seed or 0,
        previous=previous,
        board_profile=board_profile,
        burnin_minutes=burn_in_minutes,
        targets=project_targets,
    )
    _output.info(
        f"calctl accept ({level.value}) of {escape(str(path))}"
        + (f" (replica {escape(str(replica))})" if replica else "")
        + (f" (previous version {escape(str(previous))})" if previous else "")
        + f" on the {spec.kind.value} device -> {escape(str(out_dir))}"
    )
    _output.info(escape(_plan_line(config)))

    def show(ev: StepEvidence) -> None:
        what = ev.key_figure if ev.ran else ev.detail
        _output.info(f"  {ev.status.value:<11} {escape(ev.name)} [dim]({ev.seconds:.1f} s)[/] {escape(what)}")

    with interruptible(), quiet_engine_log():
        result = accept_lib.run_accept(
            config, log=lambda line: _output.info(f"    [dim]{escape(line)}[/]"), on_step=show
        )
    write_atomic(out_dir / accept_lib.JUNIT_FILE, junit_xml(result))
    if format is Format.json:
        _output.emit_json(result)
    elif format is Format.junit:
        _output.emit_junit("calctl accept", junit_suites(result))
    else:
        _render(result)
    if format is not Format.table:
        _output.info(escape(result.body["summary"]))
    return result.exit_code


#: The board's own steps, shown before the rows (``calctl.runners.board_steps``; spelled here so that
#: ``--help`` imports no runner).
BOARD_STEPS = ("device-check", "conformance", "selftest", "burn-in")

#: How long a level takes on the mock, said before it starts (#53 item 5); a board's steps take their own time.
_ESTIMATE = {
    "quick": "about 1–3 min on the mock (72 s measured on 2 cores)",
    "standard": "well under an hour on the mock",
    "long": "about 24 h: the soak alone runs 24 h",
}


def _plan_line(config: Any) -> str:
    """``plan: validate, ..., soak (3 cycles of 0.5 s traffic), rollback; about 1–3 min on the mock``."""
    from calctl.runners.acceptance.evidence import STEPS
    from calctl.runners.board_steps import (
        BURNIN,
        CONFORMANCE,
        SELFTEST,
        burnin_skip_reason,
        conformance_skip_reason,
        selftest_skip_reason,
    )

    st = config.settings
    soak = f"{st.soak_cycles} cycles" if st.soak_cycles is not None else f"{st.soak_hours:g} h"
    budget = st.executor_max_rounds or 3 * st.executor_rounds
    named = {
        "soak": f"soak ({soak} of {st.soak_traffic_s:g} s traffic)",
        "executor-modes": f"executor-modes ({st.executor_rounds} rounds, up to {budget})",
        BURNIN: f"burn-in ({st.burnin_minutes:g} min)",
    }
    skipped = {SELFTEST} if selftest_skip_reason(config.level.value) else set()
    skipped |= {BURNIN} if burnin_skip_reason(config.level.value) else set()
    skipped |= {CONFORMANCE} if conformance_skip_reason(config.device) else set()
    steps = ", ".join(named.get(s.name, s.name) for s in STEPS if config.wants(*s.rows) and s.name not in skipped)
    return f"plan: {steps}; {_ESTIMATE.get(config.level.value, 'its own time')}"


def _render(result: Report) -> None:
    from calctl.runners.acceptance import run as accept_lib

    doc = result.document()
    rows = doc["rows"]
    _output.print_table(
        f"calctl accept ({doc['level']})",
        ["row", "verdict", "key figure"],
        [
            [f"{r['id']} {escape(r['title'])}", _output.styled_verdict(r["verdict"]), escape(r["key_figure"])]
            for r in rows
        ],
    )
    out = _output.stdout
    for step in doc.get("steps") or []:  # the board's own steps first: a board not ready is why nothing ran
        if step["name"] in BOARD_STEPS and step["status"] != "SKIP":
            why = f" — {escape(step['detail'])}" if step["detail"] and step["status"] != "PASS" else ""
            out.print(
                Padding(
                    f"board {escape(step['name'])} {_output.styled_verdict(step['status'])}: "
                    f"{escape(step['key_figure'])}{why}",
                    (0, 0, 0, 2),
                ),
                soft_wrap=False,
            )
    skipped = [r["id"] for r in rows if r["key_figure"] == "not asked for"]
    for r in rows:
        if r["id"] in skipped:
            continue
        if r["verdict"] == "NO-GO":
            out.print(
                Padding(
                    f"{r['id']} {_output.styled_verdict('NO-GO')}: {escape(r['reason'])}. [bold]Action:[/] {escape(r['action'])}",
                    (0, 0, 0, 2),
                ),
                soft_wrap=False,
            )
        elif r["verdict"] == "NOT MEASURED":
            how = f" To measure: {escape(r['how_to_measure'])}" if r["how_to_measure"] else ""
            out.print(
                Padding(
                    f"{r['id']} {_output.styled_verdict('NOT MEASURED')}: {escape(r['reason'])}.{how}", (0, 0, 0, 2)
                ),
                soft_wrap=False,
            )
    if skipped:
        out.print(f"  not asked for (--only): {', '.join(skipped)}")
    out.print(
        f"device {doc['device']}; package {escape(str(doc['package']))}"
        + (f"; replica {escape(str(doc['replica']))}" if doc.get("replica") else "")
    )
    if doc.get("note"):
        out.print(f"[yellow]{escape(doc['note'])}[/]")
    out_dir = Path(doc["report_dir"])
    out.print(
        f"report: {escape(str(out_dir / accept_lib.REPORT_FILE))}; picture: "
        f"{escape(str(out_dir / accept_lib.PLOT_FILE))}; junit: {escape(str(out_dir / accept_lib.JUNIT_FILE))}"
    )
    out.print(f"page: {escape(str(out_dir / 'report.html'))} (one self-contained file to open or attach)")
    out.print(f"{escape(doc['summary'])} in {doc['seconds']:.1f} s")


# ---------------------------------------------------------------------------
# JUnit: one testcase per row


def _case(r: dict[str, Any]) -> _output.JunitCase:
    name = f"{r['id']} {r['title']}"
    text = "\n".join([r["condition"], *r["evidence"], *(f"{k}: {v}" for k, v in r["files"].items())])
    if r["verdict"] == "GO":
        return _output.JunitCase(name, "calctl.accept", None, None, output=f"{r['key_figure']}\n{text}")
    if r["verdict"] == "NO-GO":
        return _output.JunitCase(
            name,
            "calctl.accept",
            None,
            "failure",
            message=f"NO-GO: {r['reason']}. Action: {r['action']}",
            kind="NO-GO",
            text=text,
            output=r["key_figure"],
        )
    how = f". To measure: {r['how_to_measure']}" if r["how_to_measure"] else ""
    return _output.JunitCase(
        name, "calctl.accept", None, "skipped", message=f"NOT MEASURED: {r['reason']}{how}", output=text
    )


def junit_suites(result: Report) -> list[_output.JunitSuite]:
    doc = result.document()
    props = [
        ("device", str(doc["device"])),
        ("mock_result", str(doc.get("mock_result")).lower()),
        ("level", str(doc["level"])),
        ("status", doc["status"]),
        ("summary", doc["summary"]),
    ]
    board = [
        _board_case(s)
        for s in doc.get("steps") or []
        if s["name"] in BOARD_STEPS and s["status"] != "SKIP"  # quick runs no self-test, standard no burn-in
    ]
    return [_output.JunitSuite("calctl.accept", [*board, *(_case(r) for r in doc["rows"])], props)]


def _board_case(step: dict[str, Any]) -> _output.JunitCase:
    """The board's own steps as testcases before the rows: a board not ready or a self-test FAIL is a failure
    (the rows it left unmeasured are skipped, so without these CI would see no failure beside exit 1)."""
    name, status = f"board {step['name']}", step["status"]
    figure = f"{step['key_figure']}\n{step['detail']}".strip()
    if status == "FAIL":
        return _output.JunitCase(
            name, "calctl.accept", step["seconds"], "failure", message=step["detail"], kind="FAIL", output=figure
        )
    if status in ("ERROR", "INTERRUPTED"):
        return _output.JunitCase(
            name, "calctl.accept", step["seconds"], "error", message=step["detail"], kind=status, output=figure
        )
    warn = step["key_figure"] if status == "WARN" else ""
    return _output.JunitCase(name, "calctl.accept", step["seconds"], None, output=figure, warning=warn)


def junit_xml(result: Report) -> str:
    return _output.junit_xml("calctl accept", junit_suites(result))


def register(app: typer.Typer) -> None:
    app.command("accept")(accept)


__all__ = ["junit_suites", "junit_xml", "register"]
