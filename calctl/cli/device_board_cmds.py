"""``calctl device check`` and ``calctl device reset``: the board's readiness, and a reset that proves itself.

Thin: turn the options into a :class:`~calctl.runners.device.DeviceSpec` (the board from the environment,
as ``device info`` takes it), call :mod:`calctl.runners.board_check`, render the report (table, JSON or
JUnit) and return its exit code: 0 ready, 1 not ready (each chip named with why), 3 no device (or, for a
reset, a board another process holds: refused, nothing reset). No device logic lives here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._boards import FLEET_DEFAULTS, FleetArgs, board_options, run_fleet
from calctl.cli._options import (
    CalrtLibOpt,
    DeviceChoice,
    DeviceOpt,
    FaultPlanOpt,
    FormatOpt,
    ReportFileOpt,
    ResultFormatOpt,
    SeedOpt,
    float_option,
    int_option,
)
from calctl.cli._output import Format, TableJson
from calctl.errors import UsageError
from calctl.report import Report

if TYPE_CHECKING:
    from calctl.runners.device import DeviceSpec
    from calctl.runners.steps import StepLog

CheckTimeoutOpt = Annotated[
    float,
    float_option(
        "--step-timeout",
        min=0.001,
        help="Seconds one known-answer job may take; a chip that takes longer is not ready (default 10).",
    ),
]


class ScopeChoice(str, enum.Enum):
    """``--scope``: the values of :class:`calctl.runtime.ResetScope` (spelled here so --help imports no runtime)."""

    chip = "chip"
    board = "board"


ScopeOpt = Annotated[
    ScopeChoice,
    typer.Option("--scope", help="chip: reset one chip (--chip N); board: reset the whole board (001 §7.1)."),
]
ChipOpt = Annotated[int | None, int_option("--chip", min=0, help="The chip a --scope chip reset resets.")]


def _spec(
    device: DeviceChoice, calrt_lib: Path | None, fault_plan: Path | None, seed: int | None, report: Path | None
) -> DeviceSpec:
    """The device to open, after refusing a --report path that is not a regular file (before the run, not after)."""
    from calctl.cli._device import device_spec
    from calctl.records import check_output
    from calctl.runtime import select_board

    if report is not None:
        check_output(report, "--report")

    board = select_board(device.value)
    if seed is None and device is DeviceChoice.mock and board.seed_from_env:
        seed = board.seed  # CALCTL_MOCK_SEED, as device info reads it
    return device_spec(device, calrt_lib, None, fault_plan, seed)


def _fan_out(
    fleet: FleetArgs,
    command: str,
    report: Path | None,
    format: Format | TableJson,
    device: DeviceChoice,
    calrt_lib: Path | None,
    fault_plan: Path | None,
) -> int:
    """``--boards``: one child calctl per board, then the fleet report (docs/boards.md)."""
    return run_fleet(
        fleet,
        command,
        report_is_dir=False,
        report=report,
        format=format,
        device=device,
        calrt_lib=calrt_lib,
        fault_plan=fault_plan,
    )


def _drive(run: Callable[[StepLog], Report], report: Path | None, format: Format) -> int:
    """Run a board command with the live step log (a signal: its INTERRUPTED report), then write and render it."""
    from calctl.cli._signals import interruptible
    from calctl.cli.runner_cmds import _finish, _live_log

    with interruptible(), _live_log(format) as log:
        result = run(log)
    return _finish(result, trace=None, plot=None, report_path=report, format=format, render=_render)


def _board(device: DeviceChoice) -> dict[str, object]:
    from calctl.runtime import select_board

    return select_board(device.value).describe()


@board_options
def check(
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    fault_plan: FaultPlanOpt = None,
    seed: SeedOpt = None,
    step_timeout: CheckTimeoutOpt = 10.0,
    report: ReportFileOpt = None,
    format: ResultFormatOpt = Format.table,
    fleet: FleetArgs = FLEET_DEFAULTS,
) -> int:
    """Is the board ready? ABI and versions, topology, per-chip health, and a known-answer job on every chip.

    The known answers are the bundled combined sample's (model A on chip 0, model B on chip 1): a chip is
    ready only when its job completed with the sealed golden answer, never on health alone. For a scheduler
    prologue, a readiness probe or a lab's place check (docs/deploy.md).

    Exit 0 ready, 1 not ready (each chip named, with why), 3 no device (library missing, device lost, the
    board held by another process), 130 interrupted.
    """
    from calctl.runners.board_check import check_board

    if fleet.boards is not None:  # one child calctl per board, then the fleet report (docs/boards.md)
        return _fan_out(fleet, "device check", report, format, device, calrt_lib, fault_plan)
    spec = _spec(device, calrt_lib, fault_plan, seed, report)
    return _drive(
        lambda log: check_board(spec, log=log, step_timeout_s=step_timeout, board=_board(device)), report, format
    )


def reset(
    scope: ScopeOpt = ScopeChoice.board,
    chip: ChipOpt = None,
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    fault_plan: FaultPlanOpt = None,
    seed: SeedOpt = None,
    step_timeout: CheckTimeoutOpt = 10.0,
    report: ReportFileOpt = None,
    format: ResultFormatOpt = Format.table,
) -> int:
    """Reset a chip or the board, then prove the board came back: topology, health, a known-answer job per chip.

    Refused, with nothing reset, while another process holds the board (its board lock, docs/calrt-c-abi.md
    §10). Never exits 0 after a reset that did not bring every chip back.

    Exit 0 the board came back (proven), 1 the reset failed or a chip did not come back (named, with why),
    2 a bad --scope/--chip, 3 no device or the board held by another process (nothing reset), 130 interrupted.
    """
    from calctl.runners.board_check import ResetRequest, reset_board
    from calctl.runtime import ResetScope

    if scope is ScopeChoice.chip and chip is None:
        raise UsageError("--scope chip needs --chip N (the chip to reset)")
    if scope is ScopeChoice.board and chip is not None:
        raise UsageError(f"--chip {chip} applies to --scope chip only (a board reset resets every chip)")
    spec = _spec(device, calrt_lib, fault_plan, seed, report)
    request = ResetRequest(ResetScope(scope.value), chip)
    return _drive(
        lambda log: reset_board(spec, request, log=log, step_timeout_s=step_timeout, board=_board(device)),
        report,
        format,
    )


ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--board-profile",
        help="The board's profile (YAML, docs/runtime.md §8): its expected figures; without it every row is NOT "
        "JUDGED. The same option as bringup's and accept's.",
    ),
]
RepeatsOpt = Annotated[int, int_option("--repeats", min=1, max=100, help="Transfers per size and row (default 5).")]


@board_options
def selftest(
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    fault_plan: FaultPlanOpt = None,
    seed: SeedOpt = None,
    profile: ProfileOpt = None,
    repeats: RepeatsOpt = 5,
    report: ReportFileOpt = None,
    format: FormatOpt = TableJson.table,
    fleet: FleetArgs = FLEET_DEFAULTS,
) -> int:
    """Host<->device transfer bandwidth per chip and both chips at once, beside the host's memcpy rate.

    Each row is judged on the device's clock at the largest size against the board profile's threshold
    (--board-profile, docs/runtime.md §8): PASS at or above it, FAIL below it naming the figure; NOT JUDGED without
    a profile; UNSUPPORTED (C4) on a runtime without device memory access, never a pass. Bytes read back must
    be those written.

    Exit 0 passed or not judged, 1 a row failed, 2 a bad profile, 3 no device, 130 interrupted.
    """
    from calctl.cli._signals import interruptible
    from calctl.runners.selftest import BoardProfile, run_selftest

    if fleet.boards is not None:  # one child calctl per board, then the fleet report (docs/boards.md)
        return _fan_out(fleet, "device selftest", report, format, device, calrt_lib, fault_plan)
    # --seed also seeds the random memory pattern, on any device (the mock's fault seed only on the mock).
    spec = _spec(device, calrt_lib, fault_plan, seed if device is DeviceChoice.mock else None, report)
    board_profile = BoardProfile.load(profile) if profile is not None else None
    with interruptible():
        result = run_selftest(spec, profile=board_profile, repeats=repeats, seed=seed or 0)
    return _emit(result, report, format)


def _emit(result: Report, report: Path | None, format: TableJson) -> int:
    from calctl.runners.driver import write_report

    if report is not None:
        write_report(result, report)  # report.json and the page beside it, as the runners' --report FILE
    if _output.is_json(format):
        _output.emit_json(result)
    else:
        _output.print_table(
            "calctl device selftest",
            ["row", "status", "GB/s", "threshold", "detail"],
            [
                [
                    escape(r["name"]),
                    _output.styled_verdict(r["status"]),
                    "n/a" if r["figure_gbps"] is None else f"{r['figure_gbps']:.2f}",
                    "-" if r["threshold_gbps"] is None else f"{r['threshold_gbps']:g}",
                    escape(r["detail"]),
                ]
                for r in result.body["rows"]
            ],
        )
        h = result.header
        lib = (h.get("device_options") or {}).get("calrt_lib")
        rt = h.get("runtime") or {}
        _output.stdout.print(
            f"device {h['device']} ({h['device_label']}), runtime {rt.get('runtime', 'n/a')}"
            + (f", library {escape(str(lib))}" if lib else "")
        )
        if h.get("note"):
            _output.stdout.print(f"[yellow]{escape(h['note'])}[/]")
        if report is not None:
            _output.stdout.print(f"report: {escape(str(report))}")
        line = f"verdict {_output.styled_verdict(result.verdict)}"
        _output.stdout.print(line + (f": {escape(result.error)}" if result.error else ""))
    return result.exit_code


def _render(report: Report) -> None:
    from calctl.cli.runner_cmds import _steps_table

    _steps_table(report)
    chips = report.body.get("chips") or []
    if chips:
        _output.print_table(
            "chips",
            ["chip", "ready", "health", "known answer", "why"],
            [
                [
                    c["chip"],
                    "yes" if c["ready"] else "[bold red]no[/]",
                    escape(str(c["health"] or "n/a")),
                    escape(f"{c['known_answer']['status']} {c['known_answer']['model'] or ''}".strip()),
                    escape(c["why"] or ""),
                ]
                for c in chips
            ],
        )
    word = "ready" if report.body.get("ready") else "NOT READY"
    h = report.header
    lib = (h.get("device_options") or {}).get("calrt_lib")
    on = f"{h.get('device')} ({h.get('device_label')})" + (f", library {lib}" if lib else "")
    board = (report.body.get("board") or {}).get("id", "n/a")
    _output.stdout.print(f"board {escape(str(board))} on {escape(on)}: [bold]{word}[/]")


def register(device_app: typer.Typer) -> None:
    device_app.command("check")(check)
    device_app.command("reset")(reset)
    device_app.command("selftest")(selftest)
