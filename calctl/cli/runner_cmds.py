"""Device runner commands: ``run-golden``, ``warmup``, ``poc combined``, ``bringup`` (docs/runners.md).

Thin bodies: turn options into a :class:`~calctl.runners.context.DeviceSpec`
and a trust policy, call the runner in :mod:`calctl.runners`, then write the
trace/plot/report files and render the report as a table, JSON or JUnit.
Every runner returns a report on every path (pass, fail, hang, device error,
Ctrl-C), so ``--report`` and ``--format json`` always get one; the exit code is
the report's (0, 1, 3, 4, 130). No device logic lives here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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
    option_group,
    report_dir,
)
from calctl.cli._logs import quiet_engine_log
from calctl.cli._options import (
    BRINGUP_TIME_SCALE_HELP,
    POC_TIME_SCALE_HELP,
    BoardProfileOpt,
    BurnInMinutesOpt,
    ReportFileOpt,
    ResultFormatOpt,
    RunLevel,
    float_option,
    int_option,
    report_dir_option,
)
from calctl.cli._output import Format, TableJson
from calctl.cli._package_arg import PackageArg
from calctl.cli._signals import interruptible
from calctl.errors import UsageError
from calctl.report import Report, StepRecord, StepStatus, Tone, tone_of

if TYPE_CHECKING:  # the runners (numpy, the rules, jsonschema, matplotlib) load when a command runs, not for --help
    from calctl.runners.device import DeviceSpec
    from calctl.runners.steps import StepLog
    from calctl.signing.policy import TrustPolicy


# ---------------------------------------------------------------------------
# Shared options

ModelOpt = Annotated[str | None, typer.Option("--model", help="Run only the model with exactly this alias.")]
StepTimeoutOpt = Annotated[
    float,
    float_option("--step-timeout", min=0.001, help="Seconds one device step may take; a hang past it is exit 4."),
]
TraceOpt = Annotated[
    Path | None, typer.Option("--trace", help="Write the per-chip trace as Chrome/Perfetto trace-event JSON here.")
]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write a PNG timeline of chip0/chip1 activity here.")]


def _step_line(rec: StepRecord) -> str:
    return (
        f"  {_output.styled_verdict(rec.status.value)} {escape(rec.name)} [dim]({rec.seconds:.2f} s)[/] "
        f"{escape(rec.detail)}"
    )


@contextlib.contextmanager
def _live_log(format: Format | TableJson) -> Iterator[StepLog]:
    """Steps on stderr as they end, so a person (or a CI log) sees progress and where a run stopped.

    On a terminal, with the table on the same screen, the progress is one transient status line (the steps
    table at the end lists every step once); in a log, or with --format json/junit, one line per step.
    """
    from calctl.runners.steps import StepLog

    if format.value == "table" and _output.stderr.is_terminal and _output.stdout.is_terminal:
        with _output.stderr.status("starting", spinner="dots") as status:

            def show_live(rec: StepRecord) -> None:
                status.update(_step_line(rec).strip())

            yield StepLog(on_record=show_live)
        return
    yield StepLog(on_record=lambda rec: _output.info(_step_line(rec)))


@dataclass(frozen=True)
class _Outputs:
    """What every device runner command takes besides its own options: --step-timeout, where its trace, plot and
    report go, and --format (one ``out`` parameter, :data:`runner_outputs`)."""

    step_timeout: float = 30.0
    trace: Path | None = None
    plot: Path | None = None
    report: Path | None = None
    format: Format = Format.table

    def __post_init__(self) -> None:
        """Refuse an output path that is a FIFO, a device, a symlink or a directory before the run, not after."""
        from calctl.cli._boards import fleet_requested
        from calctl.records import check_output

        # with --boards, --report names the fleet's directory (docs/boards.md), checked by the fan-out
        report = None if fleet_requested() else self.report
        for option, path in (("--trace", self.trace), ("--plot", self.plot), ("--report", report)):
            if path is not None:
                check_output(path, option)


_OUTPUTS = _Outputs()
runner_outputs = option_group(
    "out",
    _Outputs,
    {
        "step_timeout": StepTimeoutOpt,
        "trace": TraceOpt,
        "plot": PlotOpt,
        "report": ReportFileOpt,
        "format": ResultFormatOpt,
    },
)


def _run_device(
    runner: Callable[..., Report],
    path: Path,
    trust: TrustPolicy,
    spec: DeviceSpec,
    out: _Outputs,
    render: Callable[[Report], None],
    **options: Any,
) -> int:
    """Run one runner with the live step log (Ctrl-C/SIGTERM: its INTERRUPTED report), then :func:`_finish` it."""
    with interruptible(), _live_log(out.format) as log:
        result = runner(path, trust=trust, device=spec, step_timeout_s=out.step_timeout, log=log, **options)
    return _finish(result, trace=out.trace, plot=out.plot, report_path=out.report, format=out.format, render=render)


def _finish(
    report: Report, *, trace: Path | None, plot: Path | None, report_path: Path | None, format: Format, render: Any
) -> int:
    """Write trace, plot and report files, render, and return the exit code."""
    from calctl.runners.driver import write_outputs

    report = write_outputs(report, report_path=report_path, trace=trace, plot=plot)
    if format is Format.json:
        _output.emit_json(report)
    elif format is Format.junit:
        _output.emit_junit(f"calctl {report.command}", junit_suites(report))
    else:
        render(report)
        _footer(report, report_path)
    if report.exit_code != 0 and format is not Format.table:
        _output.info(f"{_output.styled_verdict(report.verdict)}: {escape(report.error or '')}")
    return report.exit_code


def provenance_line(header: Mapping[str, Any]) -> str:
    """``device mock, runtime 0.7.6; package NAME VERSION sha256:..., signer ...``, or what was not established."""
    pkg = header.get("package") or {}
    rt = header.get("runtime") or {}
    if pkg.get("name"):
        what = f"package {escape(str(pkg['name']))} {escape(str(pkg.get('version') or ''))}".rstrip()
        what += f" sha256:{pkg.get('digest') or 'n/a'}, signer {pkg.get('signer_key_id') or 'not verified'}"
    elif pkg.get("not_validated"):  # the run stopped before validate (a board that is not ready): never "refused"
        what = f"package {escape(str(pkg.get('path') or 'n/a'))}: not validated ({escape(str(pkg['not_validated']))})"
    else:
        digest = f" (sha256:{pkg['digest']})" if pkg.get("digest") else ""
        what = f"package {escape(str(pkg.get('path') or 'n/a'))}{digest}: refused before it was loaded"
    return f"device {header['device']}, runtime {rt.get('runtime', 'n/a')}; {what}"


def _footer(report: Report, report_path: Path | None) -> None:
    out = _output.stdout
    h = report.header
    out.print(provenance_line(h))
    if h.get("note"):
        out.print(f"[yellow]{escape(h['note'])}[/]")
    for label, key in (("trace", "json"), ("plot", "plot")):
        if report.body.get("trace", {}).get(key):
            out.print(f"{label}: {escape(report.body['trace'][key])}")
    if report_path is not None:
        from calctl.html_report import page_path

        out.print(f"report: {escape(str(report_path))}")
        out.print(f"page: {escape(str(page_path(report_path)))} (one self-contained file to open or attach)")
    line = f"verdict {_output.styled_verdict(report.verdict)}"
    if report.error:
        line += f": {escape(report.error)}"
    elif report.verdict == "WARN":
        warnings = report.body.get("warnings") or []
        line += f": passed with {len(warnings)} warning(s): " + escape("; ".join(warnings))
    elif report.verdict in ("S1", "S2") and report.body.get("reasons"):
        line += f": {escape(report.body['reasons'][0])}"
    out.print(line)


def _steps_table(report: Report) -> None:
    _output.print_table(
        f"calctl {report.command}",
        ["step", "status", "seconds", "detail"],
        [
            [escape(s["name"]), _output.styled_verdict(s["status"]), f"{s['seconds']:.2f}", escape(s["detail"])]
            for s in (x.to_dict() for x in report.steps or ())
        ],
    )


# ---------------------------------------------------------------------------
# JUnit: one testcase per step


def junit_suites(report: Report) -> list[_output.JunitSuite]:
    suite_name = f"calctl.{report.command.replace(' ', '.')}"
    cases = [
        _output.JunitCase(
            name=s["name"],
            classname=suite_name,
            seconds=s["seconds"],
            outcome=_output.junit_outcome(StepStatus(s["status"]).value),
            message=s["detail"],
            kind="fail" if s["status"] == StepStatus.FAIL.value else s["status"].lower(),
            output=s["detail"],
            warning=s["detail"] or "WARN" if s["status"] == StepStatus.WARN.value else "",
        )
        for s in (x.to_dict() for x in report.steps or ())
    ]
    props = [
        ("device", str(report.header["device"])),
        ("verdict", report.verdict),
        ("package_digest", report.header["package"].get("digest") or ""),
        ("mock_result", str(report.header.get("mock_result")).lower()),
    ]
    return [_output.JunitSuite(suite_name, cases, props)]


def junit_xml(report: Report) -> str:
    return _output.junit_xml(f"calctl {report.command}", junit_suites(report))


# ---------------------------------------------------------------------------
# run-golden


@device_options("fault_plan", "time_scale", "seed")
@runner_outputs
@board_options
def run_golden(
    pkg: PackageArg = None,
    model: ModelOpt = None,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    out: _Outputs = _OUTPUTS,
    fleet: FleetArgs = FLEET_DEFAULTS,
) -> int:
    """Golden correctness of every model on a device.

    Validates, configures, then per model runs prefill + greedy decode against the package's golden data
    (logits within rtol/atol, top-k agreement, exact tokens).

    Exit 0 every model exact, 1 a mismatch (named: model, step, position) or a refused package,
    3 device error, 4 a step hung past --step-timeout (partial report written), 130 Ctrl-C.
    """
    from calctl.runners.golden import run_golden as golden_runner

    if fleet.boards is not None:  # one child calctl per board, then the fleet report (docs/boards.md)
        return run_on_boards(fleet, "run-golden", dev, report=out.report, format=out.format, report_is_dir=False)
    spec = dev.spec()
    path, trust, _ = dev.package(pkg)
    return _run_device(golden_runner, path, trust, spec, out, _render_golden, model=model)


def _render_golden(report: Report) -> None:
    from calctl.runners.golden import GoldenResult

    _steps_table(report)
    rows = []
    for r in report.body.get("models", []):
        assert isinstance(r, GoldenResult)
        rows.append(
            [
                escape(r.alias),
                _output.styled_verdict("PASS" if r.ok else "FAIL"),
                "yes" if r.prefill_allclose else "no",
                "n/a" if r.prefill_max_abs_err is None else f"{r.prefill_max_abs_err:.3g}",
                "n/a" if r.topk_agree is None else ("yes" if r.topk_agree else "no"),
                f"{len(r.got_tokens)}/{len(r.expected_tokens)}",
                "" if r.first_mismatch is None else str(r.first_mismatch),
                escape(r.reason or ""),
            ]
        )
    for nr in report.body.get("not_run", []):
        rows.append([escape(nr["alias"]), _output.styled_verdict("SKIP"), "", "", "", "", "", escape(nr["reason"])])
    if rows:
        _output.print_table(
            "golden per model",
            ["model", "verdict", "logits allclose", "max |err|", "top-k", "tokens", "first mismatch", "reason"],
            rows,
        )
    programs = report.body.get("programs", [])
    if programs:
        _output.stdout.print(
            "programs configured: "
            + "; ".join(
                f"chip{c['chip']}: {len(c['programs'])} ({sum(1 for p in c['programs'] if p['sealed'])} sealed)"
                for c in programs
            )
        )


# ---------------------------------------------------------------------------
# warmup


@device_options("fault_plan", "time_scale", "seed")
@runner_outputs
def warmup(
    pkg: PackageArg = None,
    iterations: Annotated[
        int, int_option("--iterations", "-n", min=1, max=100000, help="Warm-up iterations per model.")
    ] = 20,
    decode_steps: Annotated[int, int_option("--decode-steps", min=0, max=4096, help="Decode jobs per iteration.")] = 8,
    model: ModelOpt = None,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    out: _Outputs = _OUTPUTS,
) -> int:
    """Warm-up latency percentiles and stability per graph on a device.

    N iterations of prefill + decode per model; per graph P50/P90/P99 latency and the coefficient of
    variation (stable when CV <= 0.25, else a WARN), and errors (failed jobs, tokens off golden).

    Exit 0 no errors (unstable latency is a warning), 1 errors, 3 device error, 4 a step hung, 130 Ctrl-C.
    """
    from calctl.runners.warmup import run_warmup as warmup_runner

    spec = dev.spec()
    path, trust, _ = dev.package(pkg)
    options = {"iterations": iterations, "model": model, "decode_steps": decode_steps}
    return _run_device(warmup_runner, path, trust, spec, out, _render_warmup, **options)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f}"


def _stability(cv: float | None, unstable: bool, limit: float | None, not_judged: bool = False) -> str:
    """Never blank: stable, WARN unstable, or why it could not be told (the CV limit is in the table's title)."""
    if unstable:
        return f"{_output.styled_verdict('WARN')} unstable"
    if cv is None:
        return "n/a (too few jobs)"
    if not_judged:
        return f"{_output.styled_verdict('NOT JUDGED')} (CV interval straddles the limit)"
    return "stable"


def _render_warmup(report: Report) -> None:
    from calctl.runners.warmup import WarmupResult

    _steps_table(report)
    rows = []
    for r in report.body.get("models", []):
        assert isinstance(r, WarmupResult)
        for graph, p in r.graphs.items():
            unstable = graph in r.unstable
            rows.append(
                [
                    escape(r.alias),
                    escape(graph),
                    str(p.count),
                    _ms(p.p50),
                    _ms(p.p90),
                    _ms(p.p99) if p.tail()[0] == "P99" else f"max {_ms(p.max)}",  # a P99 needs 100 jobs
                    "n/a" if p.cv is None else f"{p.cv:.3f}",
                    _stability(p.cv, unstable, report.body.get("cv_warn"), graph in r.not_judged),
                    f"{r.errors}/{r.iterations}",
                ]
            )
    if rows:
        _output.print_table(
            "warm-up latency per graph (ms, "
            + ("device clock" if all(r.clock == "device" for r in report.body.get("models", [])) else "HOST clock")
            + ", first iteration excluded; P99 from 100 jobs on, else the max; "
            f"stable: CV interval <= {report.body.get('cv_warn', 0.25):g}; errors of iterations)",
            ["model", "graph", "jobs", "P50", "P90", "P99", "CV", "stability", "errors"],
            rows,
        )


# ---------------------------------------------------------------------------
# poc combined


@device_options("fault_plan", "time_scale", "seed", "serialize_chips", time_scale=POC_TIME_SCALE_HELP)
@runner_outputs
def poc_combined(
    pkg: PackageArg = None,
    expect_models: Annotated[
        str | None,
        typer.Option(
            "--expect-models",
            help="The exact two aliases the combined calbin must hold, e.g. model-a,model-b "
            "(default only for the bundled sample).",
        ),
    ] = None,
    rounds: Annotated[
        int, int_option("--rounds", min=2, max=10000, help="Measurement rounds (A alone, B alone, A+B).")
    ] = 8,
    max_rounds: Annotated[
        int | None,
        int_option(
            "--max-rounds",
            min=2,
            max=100000,
            help="Round budget: while a confidence interval straddles its gate, measure one more round at a time "
            "up to this many (default 4 x --rounds); still straddling: NOT JUDGED.",
        ),
    ] = None,
    require_s2: Annotated[bool, typer.Option("--require-s2", help="Exit 1 unless the verdict is S2.")] = False,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    out: _Outputs = _OUTPUTS,
) -> int:
    """The combined-calbin PoC, exactly 001 §6.4: open device, create calbin, check exact model names and chip
    targets (exit 1 before configure on any problem), configure once, A/B buffers, A golden, B golden, rounds of
    A alone / B alone / A+B together checked against golden, S1/S2 verdict from overlap_ratio,
    throughput_efficiency and the per-chip trace on the device's clock, each a bootstrap CI that must lie on one
    side of its gate (else more rounds up to --max-rounds, then NOT JUDGED), drain, reset configuration, release.

    Exit 0 for S1, S2 or NOT JUDGED (with --require-s2 only S2), 1 refused package or output mismatch,
    3 device error, 4 a step hung, 130 Ctrl-C.
    """
    from calctl.runners.poc import parse_expect_models, run_poc_combined

    spec = dev.spec()
    path, trust, bundled = dev.package(pkg)
    if expect_models is None:
        if not bundled:
            raise UsageError(
                "--expect-models is required: the PoC checks the exact model names before configure (001 §6.4)",
                hint="e.g. --expect-models model-a,model-b",
            )
        expect_models = "model-a,model-b"
    options = {
        "expect_models": parse_expect_models(expect_models),
        "rounds": rounds,
        "max_rounds": max_rounds,
        "require_s2": require_s2,
    }
    return _run_device(run_poc_combined, path, trust, spec, out, _render_poc, **options)


def _est(d: dict[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    lo, hi = d.get("ci_low"), d.get("ci_high")
    ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else " (no CI)"
    return f"{d['mean']:.3f}{ci}"


#: What the two PoC figures can be, printed under them (issue 21: "overlap_ratio tops out at 0.5").
OVERLAP_BOUNDS = (
    "overlap_ratio = 1 - T_joint / (T_A + T_B): 0 = no faster than A then B; at most "
    "1 - max(T_A, T_B) / (T_A + T_B), which is 0.5 for equal A and B fully in parallel. "
    "throughput_efficiency = joint tokens/s / (A + B isolated tokens/s): 1 = no loss; a value just above 1 "
    "(e.g. 1.01) is timing noise, not a gain"
)


def _render_poc(report: Report) -> None:
    _steps_table(report)
    body = report.body
    rounds = body.get("rounds", [])
    if rounds:
        _output.print_table(
            f"rounds ({'device' if all(r.clock == 'device' for r in rounds) else 'HOST'} seconds)",
            ["round", "A alone", "B alone", "A+B joint", "overlap_ratio", "efficiency", "both chips busy"],
            [
                [
                    str(r.index),
                    f"{r.t_a:.4f}",
                    f"{r.t_b:.4f}",
                    f"{r.t_joint:.4f}",
                    f"{r.overlap_ratio:.3f}",
                    f"{r.throughput_efficiency:.3f}",
                    "n/a" if r.both_busy_fraction is None else f"{r.both_busy_fraction:.0%}",
                ]
                for r in rounds
            ],
        )
    out = _output.stdout
    if "overlap_ratio" in body:
        out.print(
            f"overlap_ratio {_est(body['overlap_ratio'])}; throughput_efficiency {_est(body['throughput_efficiency'])} "
            "(mean [95% bootstrap CI] over rounds, 001 §13.2)"
        )
        out.print(f"[dim]{OVERLAP_BOUNDS}[/]")
    ho = body.get("host_overhead")
    if ho:
        out.print(
            f"host overhead: {ho['share_of_host_time']:.0%} of the host's {ho['host_seconds']:.2f} s "
            f"({ho['clock']} clock; reported, never judged)"
        )
    for reason in body.get("reasons", []):
        out.print(f"  - {escape(reason)}")
    xt = body.get("crosstalk")
    if xt:
        out.print(
            f"crosstalk: {xt['checked_generations']} generations / {xt['checked_tokens']} tokens checked, "
            f"{xt['mismatch_count']} mismatch(es); {escape(xt['note'])}"
        )
    out.print(f"[dim]{escape(body.get('capability', ''))}[/]")


# ---------------------------------------------------------------------------
# bringup


@device_options("fault_plan", "time_scale", time_scale=BRINGUP_TIME_SCALE_HELP)
@board_options
def bringup(
    pkg: PackageArg = None,
    level: Annotated[
        RunLevel,
        typer.Option("--level", help="quick | standard | long: warm-up iterations, PoC rounds, step timeouts."),
    ] = RunLevel.STANDARD,
    report: Annotated[
        Path | None,
        report_dir_option("./calctl-reports/bringup-<timestamp>", "report.json, each step's trace and picture"),
    ] = None,
    board_profile: BoardProfileOpt = None,
    burn_in_minutes: BurnInMinutesOpt = None,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    format: ResultFormatOpt = Format.table,
    fleet: FleetArgs = FLEET_DEFAULTS,
) -> int:
    """The bench pipeline in one command: device check, ABI conformance, self-test, burn-in, validate, budget,
    golden, warm-up, PoC, soak.

    Runs the device check (every level; a board that is not ready stops the run there, naming the chip), the
    ABI conformance suite on a calrt library (at the level; a failing check names its clauses), the
    self-test (standard and long; NOT JUDGED without --board-profile), the burn-in (long: 10 min, or
    --burn-in-minutes; a FAIL names the figure, the chip and the limit), validate, budget, run-golden, warmup,
    the combined PoC (for a combined or replica package) and a short load/unload soak, in that order; one
    summary, and report.json with every step's report, trace and picture in the report directory (default
    ./calctl-reports/bringup-<timestamp>, printed at the start).

    With no PKG: the bundled combined sample on the mock device. Exit 0 PASS/WARN, else the first failing
    step's code (1 fail, 3 device, 4 timeout, 130 Ctrl-C).
    """
    from calctl.runners import bringup as bringup_lib
    from calctl.runners.driver import write_report

    check_burnin_minutes(burn_in_minutes, level.value)  # before any board runs: refused once, not per board
    if fleet.boards is not None:  # one child calctl per board, then the fleet report (docs/boards.md)
        return run_on_boards(fleet, "bringup", dev, report=report, format=format)
    spec = dev.spec()
    path, trust, _ = dev.package(pkg)
    check_board_profile(board_profile)
    out_dir = report_dir(report, "bringup")
    config = bringup_lib.BringupConfig(
        package=path,
        trust=trust,
        device=spec,
        level=bringup_lib.Level(level.value),
        out_dir=out_dir,
        board_profile=board_profile,
        burnin_minutes=burn_in_minutes,
    )
    _output.info(
        f"calctl bringup ({level.value}) of {escape(str(path))} on the {spec.kind.value} device -> {escape(str(out_dir))}"
    )
    # the plan before it starts (#53 item 5): the steps in order; each step's own line says its time as it ends
    _output.info(
        f"plan: {', '.join(s.name for s in bringup_lib.STEPS)} (a board that is not ready stops the run; a step "
        "whose input failed is skipped)"
    )

    with interruptible(), quiet_engine_log(), _bringup_steps(format) as show:
        result = bringup_lib.run_bringup(config, on_step=show)
    write_report(result, out_dir / "report.json")
    if _output.is_json(format):
        _output.emit_json(result)
    elif format is Format.junit:  # a lab's CI reads one testcase per step (docs/lab.md)
        _output.emit_junit(f"calctl {result.command}", junit_suites(result))
    else:
        _render_bringup(result)
    return result.exit_code


@contextlib.contextmanager
def _bringup_steps(format: Format) -> Iterator[Callable[[Any], None]]:
    """Each step as it ends. On a terminal whose screen also gets the table, one transient status line (the
    table lists every step once; #53 item 10: it listed them twice); in a log, or with --format json, a line
    per step."""

    def line(o: Any) -> str:  # a SKIP has no figure: its reason
        return f"{_output.styled_verdict(o.verdict)} {escape(o.name)} [dim]({o.seconds:.2f} s)[/] " + escape(
            o.key_figure or o.detail
        )

    if format.value == "table" and _output.stderr.is_terminal and _output.stdout.is_terminal:
        with _output.stderr.status("starting", spinner="dots") as status:
            yield lambda o: status.update(line(o))
        return
    yield lambda o: _output.info("  " + line(o))


def _render_bringup(result: Report) -> None:
    doc = result.document()
    rows = [
        [escape(s["step"]), _output.styled_verdict(s["verdict"]), escape(s["key_figure"]), f"{s['seconds']:.2f} s"]
        for s in doc["summary"]
    ]
    _output.print_table(f"calctl bringup ({doc['level']})", ["step", "verdict", "key figure", "duration"], rows)
    out = _output.stdout
    for s in doc["summary"]:
        if tone_of(s["verdict"]) is not Tone.GOOD and s["detail"]:  # a step not plainly good says why
            out.print(Padding(f"{escape(s['step'])}: {escape(s['detail'])}", (0, 0, 0, 2)), soft_wrap=False)
    out.print(provenance_line(doc))
    if doc.get("note"):
        out.print(f"[yellow]{escape(doc['note'])}[/]")
    out.print(f"report: {escape(str(Path(doc['report_dir']) / 'report.json'))} (traces and plots alongside)")
    out.print(
        f"page: {escape(str(Path(doc['report_dir']) / 'report.html'))} (one self-contained file to open or attach)"
    )
    line = f"verdict {_output.styled_verdict(result.verdict)} in {doc['seconds']:.1f} s"
    if result.verdict == "INTERRUPTED" and result.error:  # the signal and where: the rows may not say it
        line += f": {escape(result.error)}"
    else:  # the first step that failed, and why (#53 item 6: `verdict FAIL in 0.4 s` named nothing)
        failed = next((s for s in doc["summary"] if tone_of(s["verdict"]) is Tone.BAD), None)
        if failed is not None:
            line += f": {escape(failed['step'])} {escape(failed['verdict'])}: {escape(failed['detail'])}"
    out.print(line)


def register(app: typer.Typer) -> None:
    app.command("run-golden")(run_golden)
    app.command("warmup")(warmup)
    poc_app = typer.Typer(help="Proof-of-concept flows on a device (001 §6.4).", no_args_is_help=True)
    poc_app.command("combined")(poc_combined)
    app.add_typer(poc_app, name="poc")
    app.command("bringup")(bringup)


__all__ = ["junit_xml", "register"]
