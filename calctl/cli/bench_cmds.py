"""``calctl bench`` (docs/bench.md).

Thin body: options -> :class:`~calctl.runners.bench.base.BenchOptions`, run the
scenario, render. One line per phase on stderr; ``bench-report.json`` and the
scenario's picture in the report directory. Exit codes: 0 gates pass (or only
measured / not judged), 1 a gate failed (named) or fault isolation F0, 2 usage
(also: server unreachable), 3 device error, 130 interrupted.
"""

from __future__ import annotations

import enum
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from calctl import html_report
from calctl.cli import _output
from calctl.cli._device import DEVICE_DEFAULTS, DeviceArgs, device_options, report_dir
from calctl.cli._options import (
    BENCH_TIME_SCALE_HELP,
    DeviceChoice,
    FormatOpt,
    SeedOpt,
    float_option,
    int_option,
    report_dir_option,
)
from calctl.cli._output import TableJson
from calctl.cli._signals import interruptible
from calctl.errors import interrupt_behind
from calctl.records import write_json

if TYPE_CHECKING:
    from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioResult
    from calctl.signing.policy import TrustPolicy


# The choices of --mode, --sweep and --target-device (str enums: Typer lists their values in --help).
ModeOpt = enum.Enum("ModeOpt", {"isolated": "isolated", "joint": "joint", "all": "all"}, type=str)
SweepOpt = enum.Enum("SweepOpt", {"concurrency": "concurrency", "rate": "rate"}, type=str)
TargetDeviceOpt = enum.Enum("TargetDeviceOpt", {"unknown": "unknown", "mock": "mock", "calrt": "calrt"}, type=str)

# The options of ``calctl bench`` (docs/bench.md).
PkgOpt = Annotated[
    Path | None,
    typer.Argument(
        help="In-process scenarios (fault-isolation, executor-modes, batch, isolation): package directory or "
        ".tar; default the bundled combined sample (batch: a B1/B4/B8/B16 sample built in the report directory; "
        "isolation: the bundled replica sample)."
    ),
]
ScenarioOpt = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        help="ab (default; --mode), interference (001 §9.4), fault-isolation (001 §13.4, in-process on the "
        "mock), executor-modes (sync/async/pingpong, in-process; docs/executor.md), batch (B1 vs "
        "B4/B8/B16, in-process; 000 §19 M3), isolation (G2 replica isolation, in-process; 001 §12 Phase 2), "
        "sweep (chosen by --sweep); an unknown name lists them.",
    ),
]
UrlOpt = Annotated[str | None, typer.Option("--url", help="The server to drive, e.g. http://127.0.0.1:8000.")]
ModelsOpt = Annotated[
    str | None, typer.Option("--models", help="A,B: the model aliases (B is measured against a saturated A).")
]
ModeOption = Annotated[
    ModeOpt, typer.Option("--mode", help="isolated | joint | all (A alone, B alone, A+B, compared).")
]
RateOpt = Annotated[float, float_option("--rate", min=0.001, help="Requests per second per model (open loop).")]
DurationOpt = Annotated[float, float_option("--duration", min=0.5, help="Seconds of arrivals per phase.")]
BurstinessOpt = Annotated[
    float, float_option("--burstiness", min=0.01, help="Gamma shape of the inter-arrival times; 1 = Poisson.")
]
PromptLenOpt = Annotated[str, typer.Option("--prompt-len", help="N | uniform:LO:HI | normal:MEAN:STD | choice:a,b")]
OutputLenOpt = Annotated[str, typer.Option("--output-len", help="max_tokens distribution, same forms.")]
SloTtftOpt = Annotated[float | None, float_option("--slo-ttft", min=0.0, help="TTFT SLO in seconds (goodput).")]
SloTpotOpt = Annotated[float | None, float_option("--slo-tpot", min=0.0, help="TPOT SLO in seconds (goodput).")]
DatasetOpt = Annotated[
    Path | None,
    typer.Option(
        "--dataset",
        help="Prompts from a local file instead of synthetic ids: JSONL of {prompt | messages, max_tokens?, "
        "timestamp?} (a timed trace when every line has a timestamp) or a ShareGPT JSON array (docs/bench.md).",
    ),
]
MaxConcurrencyOpt = Annotated[
    int | None,
    int_option("--max-concurrency", min=1, max=4096, help="At most N requests in flight per phase (others wait)."),
]
SweepOption = Annotated[
    SweepOpt | None,
    typer.Option("--sweep", help="concurrency | rate: one model (--models) up a ladder of levels; the knee."),
]
SweepLevelsOpt = Annotated[
    str | None,
    typer.Option("--sweep-levels", help="Comma-separated levels (default 1,2,4,8,16,32 or 0.5,1,2,4,8,16 req/s)."),
]
MaxRequestsOpt = Annotated[int, int_option("--max-requests", min=1, help="Cap per model and phase.")]
RequestsOpt = Annotated[
    int | None,
    int_option(
        "--requests",
        help="isolation: requests of the concurrent run over both aliases (default 1000; 001 §13.1: >= 1000).",
    ),
]
RequestTimeoutOpt = Annotated[float, float_option("--request-timeout", min=0.1, help="Seconds one request may take.")]
WindowOpt = Annotated[
    float | None,
    float_option("--window", min=0.05, help="Steady-state window (s) for the CIs; default duration/10."),
]
TokenRangeOpt = Annotated[str, typer.Option("--token-range", help="LOW:HIGH prompt token ids.")]
TemperatureOpt = Annotated[
    float, float_option("--temperature", min=0.0, max=2.0, help="Sampling temperature of every request.")
]
ApiKeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="CALCTL_BENCH_API_KEY", help="Bearer key for the server.")
]
TargetDeviceOption = Annotated[
    TargetDeviceOpt,
    typer.Option("--target-device", help="What the server runs on, to label the report (docs/bench.md, mock results)."),
]
ReportOpt = Annotated[
    Path | None,
    report_dir_option("./calctl-reports/bench-<timestamp>", "bench-report.json and the scenario's picture"),
]


@device_options("time_scale", "fault_plan", time_scale=BENCH_TIME_SCALE_HELP)
def bench(
    pkg: PkgOpt = None,
    scenario: ScenarioOpt = None,
    url: UrlOpt = None,
    models: ModelsOpt = None,
    mode: ModeOption = ModeOpt.all,
    rate: RateOpt = 4.0,
    duration: DurationOpt = 10.0,
    burstiness: BurstinessOpt = 1.0,
    prompt_len: PromptLenOpt = "uniform:8:64",
    output_len: OutputLenOpt = "uniform:8:48",
    slo_ttft: SloTtftOpt = None,
    slo_tpot: SloTpotOpt = None,
    dataset: DatasetOpt = None,
    max_concurrency: MaxConcurrencyOpt = None,
    sweep: SweepOption = None,
    sweep_levels: SweepLevelsOpt = None,
    seed: SeedOpt = None,
    max_requests: MaxRequestsOpt = 10000,
    requests: RequestsOpt = None,
    request_timeout: RequestTimeoutOpt = 60.0,
    window: WindowOpt = None,
    token_range: TokenRangeOpt = "3:256",
    temperature: TemperatureOpt = 1.0,
    api_key: ApiKeyOpt = None,
    target_device: TargetDeviceOption = TargetDeviceOpt.unknown,
    report: ReportOpt = None,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    format: FormatOpt = TableJson.table,
) -> int:
    """Load generator and verdicts: A/B, interference, fault-isolation, executor-modes.

    Open-loop streaming requests against an OpenAI-compatible server: TTFT, TPOT, ITL, E2E at P50/P90/P99
    (each with its sample count), throughput, success rate, goodput. --mode all compares A and B isolated
    with A+B joint (overlap_ratio and throughput_efficiency with bootstrap CIs, P99 degradation, B success)
    against the 001 §13.2 gates; a gate with too few samples is NOT JUDGED, never PASS or FAIL.
    --scenario interference runs the four prefill/decode pairs (001 §9.4); --scenario fault-isolation grades
    F0/F1/F2 in-process on the mock (001 §13.4); --scenario executor-modes compares the sync, async and
    ping/pong executors in-process (docs/executor.md); --scenario batch measures fill ratio, tokens/s and P99 per
    decode profile and checks every lane against B1 (000 §19 M3); --scenario isolation is gate G2 on a replica
    package: serial golden, then --requests concurrent requests over both aliases, every output against the
    package reference (001 §12 Phase 2, §13.1).

    Exit 0 gates pass (or only measured, or G2 GO), 1 a gate failed (named), fault isolation F0 or G2 NO-GO, 2 usage
    (also: server unreachable), 3 device error.
    """
    from calctl.loadgen.metrics import Slo
    from calctl.loadgen.workload import LengthDist, TokenRange
    from calctl.runners.bench.base import BenchOptions, Mode
    from calctl.runners.bench.scenarios import check_options, choose

    given = {
        option
        for option, on in (
            ("PKG", pkg is not None),
            ("--url", url is not None),
            ("--requests", requests is not None),
            ("--sweep", sweep is not None),
            ("--sweep-levels", sweep_levels is not None),
            ("--device", dev.device is not DeviceChoice.mock),
            ("--time-scale", dev.time_scale is not None),
            ("--fault-plan", dev.fault_plan is not None),
        )
        if on
    }
    chosen = choose(scenario, given)
    out_dir = report_dir(report, "bench")
    check_options(chosen, given)
    spec = None if chosen.needs_url else dev.spec()
    package, trust = (None, None) if chosen.needs_url else _package(chosen, pkg, dev)
    from calctl.loadgen.dataset import load_dataset
    from calctl.runners.bench.sweep import parse_levels

    opts = BenchOptions(
        out_dir=out_dir,
        dataset=load_dataset(dataset) if dataset is not None else None,
        output_given=output_len != "uniform:8:48",
        max_concurrency=max_concurrency,
        sweep=sweep.value if sweep is not None else None,
        sweep_levels=parse_levels(sweep_levels, sweep.value) if sweep is not None else None,
        url=url,
        models=tuple(m.strip() for m in (models or "").split(",") if m.strip()),
        mode=Mode(mode.value),
        rate=rate,
        duration_s=duration,
        burstiness=burstiness,
        prompt=LengthDist.parse(prompt_len, name="prompt-len"),
        output=LengthDist.parse(output_len, name="output-len"),
        slo=Slo(slo_ttft, slo_tpot),
        seed=0 if seed is None else seed,
        max_requests=max_requests,
        request_timeout_s=request_timeout,
        window_s=window,
        token_range=TokenRange.parse(token_range),
        temperature=temperature,
        api_key=api_key,
        target_device=target_device.value if spec is None else spec.kind.value,
        package=package,
        trust=trust,
        device=spec,
        requests=BenchOptions.requests if requests is None else requests,  # the default accept runs too
    )
    return _run_and_report(chosen, opts, format)


def _package(chosen: Scenario, pkg: Path | None, dev: DeviceArgs) -> tuple[Path | None, TrustPolicy]:
    """(package, trust policy) of an in-process scenario: PKG, else the bundled sample it names (trusting its
    test-only key), else none (the scenario builds its own)."""
    if pkg is not None or chosen.default_package == "combined":
        package, trust, _ = dev.package(pkg)
        return package, trust
    from calctl.signing.policy import make_policy

    trust = make_policy(dev.trusted_key, dev.allow_unsigned, trust_test_key=True)
    if chosen.default_package is None:
        return None, trust
    from calctl.compiler.bundled import bundled_package

    package = bundled_package(chosen.default_package)
    _output.info(f"[dim]using the bundled {chosen.default_package} sample package: {escape(str(package))}[/]")
    return package, trust


def _run(chosen: Scenario, opts: BenchOptions) -> ScenarioResult:
    """The scenario's result; a SIGINT or SIGTERM (or a teardown error behind one) ends it INTERRUPTED with what
    it had finished (exit 130). The one place ``calctl bench`` turns an interrupt into a report, until the run
    driver does it for every run (issue 48): it catches ``KeyboardInterrupt`` and an error behind one, never
    ``BaseException``."""
    from calctl.runners.bench.base import interrupted_result

    try:
        with interruptible():
            return chosen.run(opts, lambda line: _output.info(escape(line)))
    except KeyboardInterrupt as exc:
        return interrupted_result(chosen.name, exc, None, opts.target_device)
    except Exception as exc:  # an error while stopping for an interrupt is part of the interrupt
        interrupt = interrupt_behind(exc)
        if interrupt is None:
            raise
        return interrupted_result(chosen.name, interrupt, exc, opts.target_device)


def _run_and_report(chosen: Scenario, opts: BenchOptions, format: TableJson) -> int:
    """Run the scenario, write ``bench-report.json`` and its page, render; the report's exit code."""
    from calctl.runners import telemetry
    from calctl.runners.bench.bench_report import REPORT_FILE, bench_report, with_device_telemetry

    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    where = (
        f" against {escape(opts.url or '')}" if chosen.needs_url else f" in-process on the {opts.target_device} device"
    )
    _output.info(f"calctl bench --scenario {chosen.name}{where} -> {escape(str(opts.out_dir))}")
    # the plan before it starts (#53 item 5): what the scenario does and, for a timed one, its pace
    pace = f"; {opts.duration_s:g} s of arrivals a phase" if chosen.reads("--duration") else ""
    _output.info(escape(f"plan: {chosen.summary}{pace}"))
    since = telemetry.mark()  # the devices the scenario opens in this process are sampled (report "telemetry")
    result = with_device_telemetry(_run(chosen, opts), since)
    bench = bench_report(opts, result, chosen.name, started, time.perf_counter() - t0)
    doc = bench.document()
    write_json(opts.out_dir / REPORT_FILE, doc)
    html_report.write(doc, opts.out_dir / REPORT_FILE)
    if _output.is_json(format):
        _output.emit_json(bench)
    else:
        _render_bench(result, doc)
    for note in result.notes if _output.is_json(format) else ():  # the table run prints them on stdout
        if note.startswith("failing gate"):
            _output.info(f"[bold red]{escape(note)}[/]")
        elif note.startswith("not judged"):
            _output.info(f"[bold yellow]{escape(note)}[/]")
    return bench.exit_code


def _render_bench(result: ScenarioResult, doc: dict[str, Any]) -> None:
    for t in result.tables:
        _output.print_rows(t.title, list(t.columns), [[escape(str(c)) for c in row] for row in t.rows])
    out = _output.stdout
    for key in ("throughput_efficiency", "overlap_ratio"):
        est = doc.get(key)
        if est and est.get("mean") is not None:
            ci = (
                f" [95 % CI {est['ci_low']:.3f}, {est['ci_high']:.3f}]" if est.get("ci_low") is not None else " (no CI)"
            )
            out.print(f"{key} {est['mean']:.3f}{ci}")
    for note in result.notes:
        out.print(f"  - {escape(note)}")
    if doc.get("note"):
        out.print(f"[yellow]{escape(doc['note'])}[/]")
    plot = doc["files"]["plot"]
    out.print(
        f"report: {escape(doc['files']['report'])}; plot: "
        + (escape(str(plot)) if plot else "none (no phase finished before the run ended)")
    )
    page = html_report.page_path(Path(doc["files"]["report"]))
    out.print(f"page: {escape(str(page))} (one self-contained file to open or attach)")
    out.print(
        f"verdict {_output.styled_verdict(result.verdict)}"
        + (f": failing {escape(', '.join(doc['failing_gates']))}" if doc["failing_gates"] else "")
        + (
            f"; not judged (too few samples or no interval): {escape(', '.join(doc['not_judged_gates']))}"
            if doc["not_judged_gates"]
            else ""
        )
    )


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


__all__ = ["register"]
