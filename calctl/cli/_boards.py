"""``--boards all|LIST``, ``--boards-file`` and ``--parallel`` of the device commands (docs/boards.md).

A command decorated with :data:`board_options` gets them as one ``fleet: FleetArgs`` parameter; when
``--boards`` is given it calls :func:`run_fleet` first thing and returns its exit code: the same command,
one child calctl process per board (calctl.fleet.fanout), each board's report directory under the fleet's
``--report`` directory, and one fleet report. The child's argv is this invocation's own (``ARGV``, set by
``calctl.cli.app.main``) without the fleet, device, report and format options, which the fan-out gives each
board itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._device import DeviceArgs, option_group
from calctl.cli._options import int_option
from calctl.errors import UsageError

if TYPE_CHECKING:
    from calctl.fleet import FleetReport

#: This invocation's arguments after ``calctl`` (root options removed): what a board's child runs again.
ARGV: list[str] = []


def fleet_requested() -> bool:
    """Whether this invocation has ``--boards`` (its ``--report`` then names the fleet's directory)."""
    return any(a == "--boards" or a.startswith("--boards=") for a in ARGV)


BoardsOpt = Annotated[
    str | None,
    typer.Option(
        "--boards",
        help="Run on several boards of this host: all, or a comma-separated list of board ids (calctl device list); "
        "one calctl process per board, concurrently, and one fleet report (docs/boards.md).",
    ),
]
BoardsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--boards-file",
        help="The boards file (YAML, docs/boards.md) listing this host's boards; default $CALCTL_BOARDS, else the "
        "shim's enumeration, else the environment's one board.",
    ),
]
ParallelOpt = Annotated[
    int,
    int_option("--parallel", min=0, max=256, help="With --boards: at most N boards at once (default 0: all of them)."),
]


@dataclass(frozen=True)
class FleetArgs:
    """The fleet options as given (defaults: not given)."""

    boards: str | None = None
    boards_file: Path | None = None
    parallel: int = 0

    def __post_init__(self) -> None:
        if self.boards is None and (self.boards_file is not None or self.parallel):
            given = "--boards-file" if self.boards_file is not None else "--parallel"
            raise UsageError(f"{given} applies with --boards only")


FLEET_DEFAULTS = FleetArgs()
board_options = option_group(
    "fleet", FleetArgs, {"boards": BoardsOpt, "boards_file": BoardsFileOpt, "parallel": ParallelOpt}
)

#: Options the fan-out gives each board itself, removed from the child's argv with their values (each takes one).
_REPLACED = frozenset(
    {"--boards", "--boards-file", "--parallel", "--report", "--device", "--calrt-lib", "--fault-plan", "--format", "-f"}
)


#: Output files of a run (run-golden's --trace and --plot): each board's child writes its own, under the board's
#: directory with the name given, never all of them into one file.
_PER_BOARD_FILES = frozenset({"--trace", "--plot"})


def child_args(argv: list[str], command_path: list[str]) -> tuple[list[str], dict[str, str]]:
    """(``argv`` without the options the fan-out replaces, ``--format json`` appended; the per-board output files
    as option -> file name). Every option removed takes a value (``--opt value`` or ``--opt=value``)."""
    if argv[: len(command_path)] != command_path:
        raise UsageError(f"--boards: cannot find the command {' '.join(command_path)} in the arguments")
    out = list(command_path)
    files: dict[str, str] = {}
    rest = argv[len(command_path) :]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            out += rest[i:]
            break
        name = a.split("=", 1)[0] if a.startswith("--") else a
        if name in _REPLACED or name in _PER_BOARD_FILES:
            value = a.split("=", 1)[1] if "=" in a else (rest[i + 1] if i + 1 < len(rest) else "")
            if name in _PER_BOARD_FILES and Path(value).name:
                files[name] = Path(value).name
            i += 1 if "=" in a else 2
            continue
        out.append(a)
        i += 1
    return [*out, "--format", "json"], files


def run_fleet(
    fleet: FleetArgs,
    command: str,
    *,
    report_is_dir: bool,
    report: Path | None,
    format: Any,
    device: Any,
    calrt_lib: Path | None,
    fault_plan: Path | None = None,
) -> int:
    """Run ``command`` (``device check``, ``bringup``, ...) once per board of ``--boards`` and print the fleet
    report; its exit code."""
    from calctl.cli._signals import interruptible
    from calctl.fleet.boards import host_boards, select
    from calctl.fleet.fanout import ChildRun, run_boards
    from calctl.records import default_report_dir

    assert fleet.boards is not None
    path = command.split()  # "device check" -> ["device", "check"]
    args, files = child_args(ARGV, path)
    listed, source = host_boards(fleet.boards_file, device.value, calrt_lib, fault_plan)
    boards = select(listed, fleet.boards, source)
    if fault_plan is not None:  # the command line's plan for every mock board without its own
        boards = [replace(b, fault_plan=fault_plan) if b.kind == "mock" and b.fault_plan is None else b for b in boards]
    out = report if report is not None else default_report_dir("-".join(path) + "-boards")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--report {out}: with --boards, --report names the fleet's directory; this is a file")
    run = ChildRun(args=args, report_is_dir=report_is_dir, command=" ".join(path), files=files)
    parallel = fleet.parallel or len(boards)
    _output.info(
        f"calctl {escape(run.command)} on {len(boards)} board(s) from {escape(source)}, {parallel} at a time "
        f"-> {escape(str(out))}"
    )

    def line(board: str, text: str) -> None:
        _output.stderr.print(f"[dim]\\[{escape(board)}][/] {escape(text)}", soft_wrap=True)

    with interruptible():
        result = run_boards(run, boards, out, parallel=fleet.parallel, on_line=line)
    return render_fleet(result, format)


def run_on_boards(
    fleet: FleetArgs, command: str, dev: DeviceArgs, *, report: Path | None, format: Any, report_is_dir: bool = True
) -> int:
    """:func:`run_fleet` for a command with the shared device options (``dev``): its board, library and fault plan
    are each child's defaults."""
    return run_fleet(
        fleet,
        command,
        report_is_dir=report_is_dir,
        report=report,
        format=format,
        device=dev.device,
        calrt_lib=dev.calrt_lib,
        fault_plan=dev.fault_plan,
    )


def render_fleet(result: FleetReport, format: Any) -> int:
    """Print the fleet report (table, JSON or JUnit) and return its exit code."""
    from calctl.records import dumps

    fmt = getattr(format, "value", str(format))
    if fmt == "json":
        import sys

        sys.stdout.write(dumps(result.document()) + "\n")
        sys.stdout.flush()
        _output.printed["report"] = True
        return result.exit_code
    if fmt == "junit":
        _output.emit_junit("calctl fleet", [_junit_suite(result)])
        return result.exit_code
    print_fleet(result)
    return result.exit_code


#: Steps shown as their own columns up to this many; more (accept's 11 rows, check's 16 steps) as one summary.
_STEP_COLUMNS = 6


def print_fleet(result: FleetReport) -> None:
    from calctl.fleet.merge import severity

    steps = list(result.steps) if len(result.steps) <= _STEP_COLUMNS else []
    rows = []
    for b in result.boards:
        if steps:
            cells = [_output.styled_verdict(escape(b.steps.get(s, "-"))) for s in steps]
        else:
            looked = [
                f"{escape(s)} {_output.styled_verdict(escape(v))}" for s, v in b.steps.items() if severity(v) >= 10
            ]
            counts: dict[str, int] = {}
            for v in b.steps.values():
                counts[v] = counts.get(v, 0) + 1
            summary = ", ".join(f"{n} {_output.styled_verdict(escape(v))}" for v, n in counts.items())
            cells = [summary + (f"; {', '.join(looked)}" if looked else "")]  # the failing steps named
        rows.append([escape(b.board_id), _output.styled_verdict(b.verdict), *cells, escape(b.reason)])
    columns = ["board", "verdict", *(steps or ["steps"]), "why"]
    _output.print_table(f"calctl fleet ({escape(result.command or 'merge')})", columns, rows)
    out = _output.stdout
    for b in result.boards:
        who = ", ".join(
            x
            for x in (
                b.device_label or b.device,
                b.selector and f"CALRT_DEVICE {b.selector}",
                f"seed {b.seed}" if b.seed is not None else None,
                b.fault_plan and f"fault plan {b.fault_plan}",
                b.library and f"library {b.library}",
                b.place and f"on {b.place}",
            )
            if x
        )
        out.print(f"  {escape(b.board_id)}: {escape(who)} -> {escape(b.report_dir or 'no report directory')}")
    if result.note:
        out.print(f"[yellow]{escape(result.note)}[/]")
    out.print(f"fleet report: {escape(str(result.json_path))} and {escape(str(result.html_path))}")
    line = f"verdict {_output.styled_verdict(result.verdict)}"
    if result.reasons:
        line += f": {escape(result.reasons[0])}"
    out.print(line)


def _junit_suite(result: FleetReport) -> _output.JunitSuite:
    from calctl.report import Tone, tone_of

    cases = []
    for b in result.boards:
        bad = tone_of(b.verdict) is Tone.BAD
        cases.append(
            _output.JunitCase(
                name=b.board_id,
                classname="calctl.fleet." + (result.command or "report merge").replace(" ", "_"),
                seconds=b.seconds,
                outcome=("failure" if b.exit_code == 1 and not b.infrastructure else "error") if bad else None,
                message=f"{b.verdict}: {b.reason}" if bad else "",
                kind=b.verdict if bad else "",
                output=f"report directory: {b.report_dir}",
            )
        )
    return _output.JunitSuite(name="calctl fleet", cases=cases)


__all__ = [
    "ARGV",
    "FLEET_DEFAULTS",
    "FleetArgs",
    "board_options",
    "child_args",
    "fleet_requested",
    "render_fleet",
    "run_fleet",
]
