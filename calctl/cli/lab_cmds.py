"""``calctl lab run``: one calctl command over the boards of a labgrid lab, one fleet report (docs/lab.md).

Thin body: options -> :class:`calctl.lab.places.LabRunPlan`, :func:`calctl.lab.places.run_lab` (reserve, lock,
run, collect, unlock), then :func:`calctl.fleet.merge_reports` over the boards' directories and the
infrastructure errors, one JUnit file of every board's cases, and the table. Exit code: the fleet's verdict's
(the worst board's; an infrastructure ERROR is 3, never a FAIL). Needs the ``lab`` extra (labgrid).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._boards import render_fleet
from calctl.cli._options import FormatOpt, float_option, int_option
from calctl.cli._output import TableJson
from calctl.cli._signals import interruptible
from calctl.errors import UsageError

#: The JUnit of the whole run: every board's suites (named after the board) and a case per infrastructure error.
FLEET_JUNIT = "fleet-junit.xml"
_MAX_JUNIT_BYTES = 16 * 2**20


def _need_labgrid() -> None:
    try:
        import labgrid  # noqa: F401
    except ImportError:
        raise UsageError(
            "calctl lab needs labgrid, which is not installed", hint="pip install 'calctl[lab]' (labgrid 26)"
        ) from None


def run(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The calctl command for every board, after --: e.g. -- bringup --level quick."),
    ] = None,
    tags: Annotated[
        str, typer.Option("--tags", help="Places whose labgrid tags include all of these: KEY=VALUE[,KEY=VALUE...].")
    ] = "",
    count: Annotated[
        int | None,
        int_option("--count", min=1, help="Run on the first N matching places to become free (default: all)."),
    ] = None,
    timeout: Annotated[
        float,
        float_option("--timeout", above=0.0, help="Seconds to wait for the places to become free (default 600)."),
    ] = 600.0,
    priority: Annotated[
        float, float_option("--priority", help="Priority of the reservations against other jobs' (default 0).")
    ] = 0.0,
    coordinator: Annotated[
        str | None,
        typer.Option(
            "--coordinator",
            envvar="LG_COORDINATOR",
            help="labgrid coordinator HOST[:PORT] (default 127.0.0.1:20408).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Directory of the run: a directory per board and the fleet report (default ./calctl-reports/lab-TIMESTAMP).",
        ),
    ] = None,
    keep_remote: Annotated[
        bool, typer.Option("--keep-remote", help="Leave each remote board's run directory on its host.")
    ] = False,
    format: FormatOpt = TableJson.table,
) -> int:
    """Run a calctl command on every lab board whose place has the tags, and merge their reports.

    Reserves each matching place (waiting for busy ones, in priority order, up to --timeout), locks it, runs
    the command for its CalculetBoard on the board's host (locally or over labgrid's SSH), brings the
    board's report directory, JUnit and log back to OUT/<board>/, unlocks it; then writes
    fleet-report.json/.html and fleet-junit.xml in OUT. A host or exporter that goes away is an
    infrastructure ERROR naming the place and host, never a board FAIL. Exit: the worst board's code (0 PASS/WARN,
    1 FAIL, 3 ERROR, 130 interrupted). Needs labgrid: the lab extra of calctl (docs/lab.md).
    """
    from calctl import records
    from calctl.fleet import merge_reports
    from calctl.lab.board import LabCommand
    from calctl.lab.places import parse_tags

    lab_command = LabCommand.parse(command or [])
    tag_map = parse_tags(tags)
    _need_labgrid()
    from calctl.lab.places import LabRunPlan, run_lab

    out_dir = out or records.default_report_dir("lab", datetime.now())
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = LabRunPlan(
        tags=tag_map,
        command=lab_command,
        out_dir=out_dir,
        count=count,
        timeout_s=timeout,
        priority=priority,
        coordinator=coordinator,
        keep_remote=keep_remote,
    )
    _output.info(
        f"plan: calctl {escape(' '.join(lab_command.args))} on every place tagged "
        f"{escape(tags)}{'' if count is None else f' (the first {count})'} -> {escape(str(out_dir))}"
    )

    def line(board_id: str, text: str) -> None:
        _output.info(escape(f"[{board_id}] {text}"))

    interrupted = None
    try:
        with interruptible():
            result = run_lab(plan, on_line=line)
    except KeyboardInterrupt as e:
        interrupted = str(e) or "SIGINT"
        result = None
    dirs = sorted(p for p in out_dir.iterdir() if p.is_dir())
    errors = [] if result is None else result.infra_errors
    fleet = merge_reports(
        dirs, out_dir, infra_errors=errors, command=" ".join(lab_command.args), interrupted=interrupted
    )
    write_junit(out_dir, fleet)
    if not _output.is_json(format):
        _output.info(f"junit: {escape(str(out_dir / FLEET_JUNIT))}")
    return render_fleet(fleet, format)


def write_junit(out_dir: Path, fleet: object) -> Path:
    """``fleet-junit.xml``: each board's own JUnit suites (renamed ``<board>: <suite>``), a suite with one case for
    a board that has none, and an error case for each infrastructure error."""
    from calctl.fleet import FleetReport
    from calctl.lab.board import JUNIT_FILE
    from calctl.records import write_atomic

    assert isinstance(fleet, FleetReport)
    root = ET.Element("testsuites", name=_output.xml_safe(f"calctl lab run {fleet.command or ''}".strip()))
    for row in fleet.boards:
        suites = (
            [] if row.infrastructure or row.report_dir is None else _board_suites(out_dir / row.report_dir / JUNIT_FILE)
        )
        for suite in suites:
            suite.set("name", _output.xml_safe(f"{row.board_id}: {suite.get('name', '')}"))
            root.append(suite)
        if not suites:
            outcome = (
                None if row.exit_code == 0 else ("error" if row.infrastructure or row.exit_code != 1 else "failure")
            )
            case = _output.JunitCase(
                name=row.board_id,
                classname="calctl.lab",
                seconds=row.seconds,
                outcome=outcome,
                message=f"{row.verdict}: {row.reason}" if outcome else "",
                kind="infrastructure" if row.infrastructure else row.verdict.lower(),
                output=f"place: {row.place or 'unknown'}",
            )
            doc = ET.fromstring(_output.junit_xml("x", [_output.JunitSuite(row.board_id, [case])]))
            root.extend(doc.findall("testsuite"))
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in root.findall("testsuite"))))
    ET.indent(root)
    path = out_dir / FLEET_JUNIT
    write_atomic(path, '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n")
    return path


def _board_suites(path: Path) -> list[ET.Element]:
    try:
        if path.stat().st_size > _MAX_JUNIT_BYTES:
            return []
        return ET.parse(path).getroot().findall("testsuite")
    except (OSError, ET.ParseError):
        return []


def register(app: typer.Typer) -> None:
    lab_app = typer.Typer(
        help="Boards in a labgrid lab: run a calctl command over tagged places.", no_args_is_help=True
    )
    lab_app.command("run", context_settings={"allow_interspersed_args": False})(run)
    app.add_typer(lab_app, name="lab")


__all__ = ["FLEET_JUNIT", "register", "write_junit"]
