"""``calctl device list``, ``calctl report merge`` and ``calctl report compare`` (docs/boards.md,
docs/report-compare.md).

Thin: the boards come from calctl.fleet.boards, the fleet report from calctl.fleet.merge, the comparison
from calctl.fleet.compare; this module renders them (table or JSON) and returns the exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._boards import BoardsFileOpt, render_fleet
from calctl.cli._options import CalrtLibOpt, DeviceChoice, DeviceOpt, FormatOpt
from calctl.cli._output import TableJson
from calctl.errors import UsageError


def device_list(
    boards_file: BoardsFileOpt = None,
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    format: FormatOpt = TableJson.table,
) -> int:
    """List the boards this host has: from a boards file, else the shim's enumeration, else the environment.

    The boards file is --boards-file or $CALCTL_BOARDS (YAML, docs/boards.md); without one, --device calrt asks
    the shim (calrt_ext_device_count/calrt_ext_device_name, when it exports them); else the one board of this
    process's environment (CALCTL_BOARD_ID, CALRT_DEVICE, CALCTL_MOCK_SEED). No board is opened: `--boards all`
    on a device command (check, selftest, ...) runs them.

    Exit 0 listed, 2 a bad boards file (the file, the field and the value named), 3 a shim that cannot be loaded.
    """
    from calctl.fleet.boards import host_boards

    lib = calrt_lib if device is DeviceChoice.calrt else None
    boards, source = host_boards(boards_file, device.value, lib)
    if _output.is_json(format):
        from calctl.report import simple_report

        body = {"source": source, "opened": False, "boards": [b.document() for b in boards]}
        _output.emit_json(simple_report("device list", body))
        return 0
    rows = [
        [
            escape(b.id),
            b.kind,
            escape(b.device or ("-" if b.kind == "mock" else "the shim's default")),
            "-" if b.seed is None else str(b.seed),
            escape(str(b.fault_plan or "-")),
            escape(str(b.library or "-")),
            escape(b.place or "-"),
        ]
        for b in boards
    ]
    _output.print_table(
        f"{len(boards)} board(s) from {escape(source)}",
        ["board", "kind", "CALRT_DEVICE", "seed", "fault plan", "library", "place"],
        rows,
    )
    _output.stdout.print(
        "not opened: `calctl device check --boards all` checks them, one process per board (docs/boards.md)"
    )
    if any(b.kind == "mock" for b in boards):
        _output.stdout.print("[yellow]mock boards are simulated: their results are not evidence about hardware[/]")
    return 0


ReportDirsArg = Annotated[
    list[Path], typer.Argument(help="Report directories of the boards' runs (each with its report.json).")
]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", help="Where fleet-report.json and fleet-report.html go (default: the current directory)."),
]


def merge(dirs: ReportDirsArg, out: OutOpt = None, format: FormatOpt = TableJson.table) -> int:
    """Merge several boards' report directories into one fleet report (boards x steps, JSON and HTML).

    A row per board: its identity (board id, device kind and library, seed), the package digest, the verdict,
    each step's verdict and a relative link to its report directory; a directory without a readable report is
    an infrastructure ERROR row, never a FAIL. Exit code: the worst row's, by the verdict table (docs/cli.md).
    Exit 2 when a path is not a directory.
    """
    from calctl.fleet import merge_reports

    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"{d}: not a report directory")
    out_dir = out if out is not None else Path.cwd()
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: not a directory")
    return render_fleet(merge_reports(dirs, out_dir), format)


AllowDifferentOpt = Annotated[
    bool,
    typer.Option(
        "--allow-different-package",
        help="Compare reports of two different packages anyway (their figures differ by the package too).",
    ),
]


def compare(
    a: Annotated[Path, typer.Argument(help="The first report: a report directory or its report.json.")],
    b: Annotated[Path, typer.Argument(help="The second report, compared against A.")],
    allow_different_package: AllowDifferentOpt = False,
    format: FormatOpt = TableJson.table,
) -> int:
    """Compare two reports figure by figure: each side by side, the difference, and whether it exceeds the intervals.

    For the same package on two boards, or one board before and after a shim or firmware change. Figures are
    matched by step and name; a figure with a confidence interval (or a latency summary's min..max) differs
    beyond it when the two runs' intervals do not overlap; a figure without one says "no interval"; host-clock
    figures are never judged (docs/report-compare.md).

    Exit 0 no figure differs beyond its interval, 1 one does (named), 2 bad input or different packages
    (without --allow-different-package).
    """
    from calctl.fleet.compare import compare as run_compare

    result = run_compare(a, b, allow_different_package=allow_different_package)
    doc = result.document()
    if _output.is_json(format):
        from calctl.report import simple_report

        _output.emit_json(simple_report("report compare", doc, verdict=result.verdict))
        return result.exit_code

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.6g}"

    def side(f: object) -> str:
        if f is None:
            return "-"
        fig = f  # a compare.Figure
        text = num(getattr(fig, "value", None))
        if getattr(fig, "has_interval", False):
            text += f" [{num(getattr(fig, 'low', None))}, {num(getattr(fig, 'high', None))}]"
        return text

    rows = []
    for r in result.rows:
        judged = r.judgement
        shown = f"[bold red]{judged}[/]" if judged == "beyond" else escape(judged)
        rel = "" if r.relative is None else f" ({r.relative:+.1%})"
        rows.append([escape(r.name), side(r.a), side(r.b), num(r.difference) + rel, shown])
    _output.print_table("calctl report compare", ["figure", "A", "B", "B - A", "vs the intervals"], rows)
    out = _output.stdout
    for who, d in (("A", doc["a"]), ("B", doc["b"])):
        out.print(
            f"{who}: {escape(str(d['report']))}: {escape(str(d['command']))} {escape(str(d['verdict']))} on "
            f"{escape(str(d['device_label'] or d['device']))}"
            + (f" board {escape(str(d['board']))}" if d["board"] else "")
            + (f", package {escape(str(d['package_digest'])[:16])}" if d["package_digest"] else "")
        )
    for note in result.notes:
        out.print(f"[yellow]{escape(note)}[/]")
    if result.beyond:
        names = ", ".join(r.name for r in result.beyond)
        out.print(f"verdict {_output.styled_verdict('FAIL')}: beyond the runs' intervals: {escape(names)}")
    else:
        out.print(f"verdict {_output.styled_verdict('PASS')}: no figure differs beyond the runs' intervals")
    return result.exit_code


def register(app: typer.Typer) -> None:
    report_app = typer.Typer(
        help="Merge several boards' report directories into a fleet report, or compare two reports figure by figure.",
        no_args_is_help=True,
    )
    report_app.command("merge")(merge)
    report_app.command("compare")(compare)
    app.add_typer(report_app, name="report")


def register_device(device_app: typer.Typer) -> None:
    device_app.command("list")(device_list)
