"""``calctl burn-in`` (docs/burn-in.md): both chips at sustained maximum load, telemetry graded against limits.

Thin body: options -> a DeviceSpec and :class:`~calctl.runners.burnin.BurnInLimits`, run
:func:`~calctl.runners.burnin.run_burnin`, write ``report.json``, ``report.html`` and ``burnin.png`` into the
report directory, render. Exit codes: 0 PASS or WARN, 1 a row FAILed (figure, chip and limit named), 2 usage
or a bad profile, 3 no device, 130 interrupted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from rich.markup import escape

from calctl.cli import _output
from calctl.cli._options import (
    CalrtLibOpt,
    DeviceChoice,
    DeviceOpt,
    FaultPlanOpt,
    FormatOpt,
    SeedOpt,
    TimeScaleOpt,
    float_option,
    report_dir_option,
)
from calctl.cli._output import TableJson
from calctl.cli.device_board_cmds import ProfileOpt

MinutesOpt = Annotated[
    float, float_option("--minutes", above=0.0, help="How long both chips run at full load (e.g. 30; more than 0).")
]
IntervalOpt = Annotated[
    float, float_option("--interval", min=0.05, help="Seconds between telemetry samples (default 1).")
]


def burn_in(
    minutes: MinutesOpt = 10.0,
    profile: ProfileOpt = None,
    interval: IntervalOpt = 1.0,
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    fault_plan: FaultPlanOpt = None,
    time_scale: TimeScaleOpt = None,
    seed: SeedOpt = None,
    report: Annotated[
        Path | None, report_dir_option("./calctl-reports/burn-in-<timestamp>", "report.json, report.html, burnin.png")
    ] = None,
    format: FormatOpt = TableJson.table,
) -> int:
    """Run both chips at sustained maximum load and grade their telemetry against limits.

    Back-to-back jobs on both chips at once (two in flight per chip) for --minutes, telemetry sampled every
    --interval seconds. Per chip: temperature, power, time throttled, ECC correctable and uncorrectable, a
    frozen sensor, failed jobs; each PASS, WARN (within 5 % of its limit) or FAIL naming figure, chip and
    limit; NOT JUDGED where the runtime does not report it. Limits from --board-profile (the telemetry block of a
    calculet-board-profile/v1), else the runtime's own limits (docs/burn-in.md).

    Exit 0 PASS or WARN, 1 a FAIL, 2 usage or a bad profile, 3 no device, 130 interrupted.
    """
    from calctl import html_report
    from calctl.cli._device import device_spec, report_dir
    from calctl.cli._signals import interruptible
    from calctl.cli.runner_cmds import _live_log, _steps_table
    from calctl.records import write_json
    from calctl.runners.burnin import BurnInLimits, run_burnin

    spec = device_spec(device, calrt_lib, time_scale, fault_plan, seed)
    limits = BurnInLimits.from_profile(profile) if profile is not None else BurnInLimits()
    out_dir = report_dir(report, "burn-in")
    out_dir.mkdir(parents=True, exist_ok=True)
    _output.info(
        escape(
            f"calctl burn-in: {minutes:g} min on the {spec.kind.value} device, both chips at full load; "
            f"limits from {limits.source} -> {out_dir}"
        )
    )
    with interruptible(), _live_log(format) as log:
        result = run_burnin(
            spec,
            minutes=minutes,
            limits=limits,
            interval_s=interval,
            log=log,
            progress=lambda line: _output.info(escape(line)),
            plot=out_dir / "burnin.png",
        )
    document = result.document()
    write_json(out_dir / "report.json", document)
    html_report.write(document, out_dir / "report.json")
    if _output.is_json(format):
        _output.emit_json(result)
        return result.exit_code
    _steps_table(result)
    _output.print_table(
        "burn-in: per chip and figure",
        ["chip", "figure", "status", "value", "limit", "detail"],
        [
            [
                r["chip"],
                escape(r["figure"]),
                _output.styled_verdict(r["status"]),
                "n/a" if r["value"] is None else f"{r['value']:g}",
                "-" if r["limit"] is None else f"{r['limit']:g}",
                escape(r["detail"]),
            ]
            for r in result.body["rows"]
        ],
    )
    h = result.header
    _output.stdout.print(f"device {h['device']} ({h['device_label']}); limits from {escape(limits.source)}")
    if h.get("note"):
        _output.stdout.print(f"[yellow]{escape(h['note'])}[/]")
    _output.stdout.print(f"report: {escape(str(out_dir / 'report.json'))} (report.html, burnin.png beside it)")
    line = f"verdict {_output.styled_verdict(result.verdict)}"
    _output.stdout.print(line + (f": {escape(result.error)}" if result.error else ""))
    return result.exit_code


def register(app: object) -> None:
    app.command("burn-in")(burn_in)  # type: ignore[attr-defined]
