"""``calctl soak`` (docs/soak.md).

Thin body: options -> :class:`~calctl.runners.soak.SoakConfig`, run, render.
A rich progress bar on stderr (ETA, live counters: the same request counts as
the summary); the runner writes its own evidence while it runs. SIGINT and
SIGTERM both end it INTERRUPTED with the evidence closed. Exit codes: 0 passed,
1 a violation (named), 2 usage, 3 device error, 130 interrupted.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._boards import FLEET_DEFAULTS, FleetArgs, board_options, run_on_boards
from calctl.cli._device import DEVICE_DEFAULTS, DeviceArgs, device_options, report_dir
from calctl.cli._logs import quiet_engine_log
from calctl.cli._options import (
    FormatOpt,
    float_option,
    int_option,
    report_dir_option,
)
from calctl.cli._output import TableJson
from calctl.cli._package_arg import PackageArg
from calctl.cli._signals import interruptible
from calctl.errors import UsageError

if TYPE_CHECKING:  # the soak loads the serving engine: only when it runs (--help stays light)
    from calctl.report import Report
    from calctl.runners.soak import SoakConfig


def _requests_line(sent: int, by_outcome: dict[str, int], *, short: bool = False) -> str:
    """One way to count requests, in the progress bar (``short``) and the summary alike: sent, succeeded, ended as
    the mix intends, refused, failed (calctl.runners.soak.wording)."""
    from calctl.runners.soak.wording import RequestCounts

    counts = RequestCounts.of(sent, by_outcome)
    return counts.short() if short else counts.phrase()


class TrafficOpt(str, enum.Enum):
    mixed = "mixed"
    none = "none"


class InjectOpt(str, enum.Enum):
    stale_completion = "stale-completion"


@device_options("fault_plan", "time_scale", "seed")
@board_options
def soak(
    pkg: PackageArg = None,
    cycles: Annotated[int | None, int_option("--cycles", min=1, help="Run N load/unload cycles.")] = None,
    hours: Annotated[
        float | None,
        float_option("--hours", above=0.0, help="Cycle until H hours have passed (e.g. 24; more than 0)."),
    ] = None,
    traffic: Annotated[
        TrafficOpt,
        typer.Option(
            "--traffic",
            help="mixed: streaming and not, cancellations, deadlines, "
            "early stops, long and invalid prompts on every model; "
            "none: load/unload only.",
        ),
    ] = TrafficOpt.mixed,
    traffic_seconds: Annotated[
        float, float_option("--traffic-seconds", min=0.0, help="Seconds of traffic per cycle between load and unload.")
    ] = 2.0,
    traffic_requests: Annotated[
        int,
        int_option(
            "--traffic-requests",
            min=0,
            help="Requests per model answered in each cycle before its traffic ends (a floor on top of "
            "--traffic-seconds, so a slow or loaded host checks as much; 0: seconds only).",
        ),
    ] = 4,
    clients: Annotated[int, int_option("--clients", min=1, max=256, help="Concurrent clients per model.")] = 3,
    inject: Annotated[
        list[InjectOpt] | None,
        typer.Option(
            "--inject",
            help="DIAGNOSTIC: stale-completion re-delivers "
            "one token of a retired generation after the "
            "first reload; the soak must then exit 1.",
        ),
    ] = None,
    report: Annotated[
        Path | None,
        report_dir_option(
            "./calctl-reports/soak-<timestamp>", "events.ndjson, soak-report.json, soak-report.html, soak.png"
        ),
    ] = None,
    checkpoint_interval: Annotated[
        float, float_option("--checkpoint-interval", min=0.05, help="Seconds between checkpoint reports.")
    ] = 60.0,
    warmup_iterations: Annotated[
        int,
        int_option("--warmup-iterations", min=0, help="Warm-up iterations per model after every load (after golden)."),
    ] = 1,
    drain_timeout: Annotated[
        float, float_option("--drain-timeout", min=0.0, help="Seconds an unload may drain.")
    ] = 30.0,
    request_timeout: Annotated[
        float,
        float_option("--request-timeout", min=0.1, help="A request with no end after this long is a violation (hang)."),
    ] = 120.0,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    format: FormatOpt = TableJson.table,
    fleet: FleetArgs = FLEET_DEFAULTS,
) -> int:
    """Load/unload soak under mixed traffic, with evidence on disk.

    000 §19 M0/M4, 001 §13.3: every cycle loads the package (golden + warm-up before Ready), serves mixed
    traffic on every model, unloads, then checks per-chip memory against the baseline (drift limit
    max(64 MiB, 1 % local DRAM)), job counters, and that no token from another generation was delivered.
    SIGINT and SIGTERM (timeout, CI cancellation, systemd) end it INTERRUPTED with its evidence closed.

    Exit 0 no violation, 1 a violation (named: chip and drift, request and generation, ...), 2 usage,
    3 device error, 130 Ctrl-C (the evidence is written on every path).
    """
    from calctl.runners import soak as soak_lib

    if (cycles is None) == (hours is None):
        raise UsageError("give exactly one of --cycles N and --hours H")
    if fleet.boards is not None:  # one child calctl per board, then the fleet report (docs/boards.md)
        return run_on_boards(fleet, "soak", dev, report=report, format=format)
    config = _config(
        dev,
        pkg,
        report,
        cycles=cycles,
        hours=hours,
        traffic=soak_lib.Traffic(traffic.value),
        traffic_seconds=traffic_seconds,
        traffic_requests=traffic_requests,
        clients_per_model=clients,
        inject=frozenset(soak_lib.Injection(i.value) for i in (inject or [])),
        checkpoint_interval_s=checkpoint_interval,
        warmup_iterations=warmup_iterations,
        drain_deadline_s=drain_timeout,
        request_timeout_s=request_timeout,
    )
    plan = f"{cycles} cycle(s)" if cycles is not None else f"{hours:g} hour(s)"
    kind = config.device.kind.value
    _output.info(
        f"calctl soak: {plan} of {escape(str(config.package))} on the {kind} device -> {escape(str(config.out_dir))}"
    )
    _output.info(escape(_plan_line(config, kind)))
    with interruptible(), quiet_engine_log(), _SoakProgress(config) as progress:
        result = soak_lib.run_soak(config, on_progress=progress.update)
    _emit(result, format)
    return result.exit_code


def _config(dev: DeviceArgs, pkg: Path | None, report: Path | None, **options: Any) -> SoakConfig:
    """The soak asked for: the package and its trust, the device, the report folder and the soak's ``options``."""
    from calctl.runners.soak import SoakConfig

    # --seed seeds the traffic (default 0); it reaches the device only to override a fault plan's own seed.
    spec = replace(dev, seed=dev.seed if dev.fault_plan is not None else None).spec()
    path, trust, _ = dev.package(pkg)
    seed = 0 if dev.seed is None else dev.seed
    return SoakConfig(package=path, trust=trust, device=spec, out_dir=report_dir(report, "soak"), seed=seed, **options)


def _emit(result: Report, format: TableJson) -> None:
    """The result on stdout (the table or one JSON document); with JSON, its error and violations on stderr."""
    doc = result.document()
    if not _output.is_json(format):
        _render_soak(doc)
        return
    _output.emit_json(result)
    if result.error:  # the table's last line says it already (#53 item 7: twice)
        _output.info(f"{_output.styled_verdict(result.verdict)}: {escape(result.error)}")
    if result.exit_code != 0:
        for v in doc["violations"][:10]:
            _output.info(
                f"[bold red]violation[/] {escape(v['kind'])}: {escape(v['message'])}"
                + (f" (x{v['occurrences']})" if v["occurrences"] > 1 else "")
            )


class _SoakProgress:
    """The soak's progress on stderr (calctl.cli._progress): a bar line that fits 80 columns with the live
    counters wrapped under it on a terminal; in a log, one line per cycle and at least one a minute."""

    def __init__(self, config: Any) -> None:
        from calctl.cli._progress import LongProgress, Plan

        hours = config.hours or 0.0
        plan = Plan("soak", float(config.cycles)) if config.cycles is not None else Plan("soak", hours * 3600, None)
        self._cycles = config.cycles
        self._progress = LongProgress(plan)

    def __enter__(self) -> _SoakProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def update(self, p: Any) -> None:
        drift = " ".join(f"chip{c} {'n/a' if v is None else f'{v:+.0f}'}" for c, v in sorted(p.max_drift_mib.items()))
        cycles = "" if self._cycles is not None else f"{p.cycles_done} cycles, "
        live = (
            f"{cycles}{p.phase}, generation {p.generation if p.generation is not None else '-'}; requests "
            f"{_requests_line(p.requests, p.by_outcome, short=True)}; {p.violations} violation(s); drift MiB {drift}"
        )
        self._progress.update(float(p.cycles_done), live, elapsed_s=p.elapsed_s)


def _plan_line(config: Any, kind: str) -> str:
    """What the soak will do and how long it will take at least, said before it starts (#53 item 5)."""
    per_cycle = "load (golden + warm-up), " + (
        f"{config.traffic_seconds:g} s of {config.traffic.value} traffic (and until {config.traffic_requests} "
        "requests per model are answered), "
        if config.traffic.value != "none"
        else ""
    )
    per_cycle += "unload and the memory check"
    if config.cycles is not None:
        from calctl.cli._progress import clock

        floor = config.cycles * (config.traffic_seconds if config.traffic.value != "none" else 0.0)
        when = f"at least {clock(floor)} of traffic alone" if floor else "a few seconds a cycle on the mock"
        return f"plan: {config.cycles} cycle(s) of {per_cycle}; {when}; the ETA follows the measured cycles"
    return f"plan: cycles of {per_cycle} until {config.hours:g} h have passed on the {kind} device"


def _render_soak(doc: dict[str, Any]) -> None:
    from calctl.runners.soak.wording import facts

    out = _output.stdout
    seen = facts(doc)
    rows = [(k, v) for k, v in seen if k != "what the counts mean"]
    rows.insert([k for k, _ in rows].index("cycles") + 1, ("duration", f"{doc['seconds']:.1f} s"))
    _output.print_table("calctl soak", ["check", "result"], [(escape(a), escape(str(b))) for a, b in rows])
    out.print(f"[dim]{escape(dict(seen)['what the counts mean'])}[/]")
    if doc["violations"]:
        _output.print_table(
            "violations",
            ["kind", "cycle", "times", "message"],
            [(escape(v["kind"]), v["cycle"], v["occurrences"], escape(v["message"])) for v in doc["violations"]],
        )
    if doc.get("note"):
        out.print(f"[yellow]{escape(doc['note'])}[/]")
    files = doc.get("files") or {}
    # only the files the run wrote: "plot: None" said nothing a person could use (#53 item 7)
    written = [f"{name}: {escape(str(files[name]))}" for name in ("report", "events", "plot") if files.get(name)]
    if written:
        out.print("; ".join(written))
    if files.get("report"):
        from calctl.html_report import page_path

        out.print(f"page: {escape(str(page_path(Path(files['report']))))} (one self-contained file to open or attach)")
    verdict = doc["verdict"]
    n = len(doc["violations"])
    line = f"verdict {_output.styled_verdict(verdict)}: {n} violation(s) in {doc['cycles']} complete cycle(s)"
    if doc.get("error"):  # the cause, as run-golden names the failing rules of a refused package
        line = f"verdict {_output.styled_verdict(verdict)}: {escape(str(doc['error']))}"
    i = doc.get("interrupted")
    if i:
        cut = f"; cycle {i['cycle']} cut short while {i['phase']}" if i.get("cycle") is not None else ""
        line += f" ({escape(i['signal'])} after {i['at_s']:.1f} s{cut}; not judged past that point)"
    out.print(line)


def register(app: typer.Typer) -> None:
    app.command("soak")(soak)


__all__ = ["register"]
