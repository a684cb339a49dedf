"""``calctl soak`` and ``calctl bench`` (docs/soak.md, docs/bench.md).

Thin bodies: options -> :class:`~calctl.runners.soak.SoakConfig` /
:class:`~calctl.runners.bench.base.BenchOptions`, call the runner, render. The
soak shows a rich progress bar on stderr (ETA, live counters) and writes its
own evidence while it runs; the bench logs one line per phase on stderr and
writes ``bench-report.json`` and ``bench.png``. Exit codes: 0 passed, 1 a
violation or a failed gate (named), 2 usage, 3 device error, 130 Ctrl-C.
"""

from __future__ import annotations

import enum
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from calctl import __version__
from calctl.cli import _output
from calctl.cli._device import device_spec
from calctl.cli._options import AllowUnsignedOpt, CalrtLibOpt, DeviceKind, DeviceOpt, FormatOpt, TrustedKeyOpt
from calctl.cli._output import Format
from calctl.cli._package_arg import PackageArg, resolve_package
from calctl.errors import UsageError
from calctl.runners.context import MOCK_LABEL

# ---------------------------------------------------------------------------
# shared


_device = device_spec


def _report_dir(report: Path | None, prefix: str) -> Path:
    out = report if report is not None else Path(f"{prefix}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--report {out}: exists and is not a directory")
    return out


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(_output.dumps(document) + "\n")
    os.replace(tmp, path)


def _mib(x: int | float | None) -> str:
    return "n/a" if x is None else f"{x / 1024**2:+.1f} MiB"


# ---------------------------------------------------------------------------
# soak


class TrafficOpt(str, enum.Enum):
    mixed = "mixed"
    none = "none"


class InjectOpt(str, enum.Enum):
    stale_completion = "stale-completion"


def soak(
    pkg: PackageArg = None,
    cycles: Annotated[int | None, typer.Option("--cycles", min=1, help="Run N load/unload cycles.")] = None,
    hours: Annotated[
        float | None, typer.Option("--hours", min=0.0, help="Cycle until H hours have passed (e.g. 24).")
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
        float, typer.Option("--traffic-seconds", min=0.0, help="Seconds of traffic per cycle between load and unload.")
    ] = 2.0,
    clients: Annotated[int, typer.Option("--clients", min=1, max=256, help="Concurrent clients per model.")] = 3,
    fault_plan: Annotated[
        Path | None,
        typer.Option("--fault-plan", help="Mock only: calctl-fault-plan/v1 YAML (e.g. a memory_leak on unload)."),
    ] = None,
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
        typer.Option(
            "--report",
            help="Evidence directory (default ./calctl-soak-<timestamp>): events.ndjson, soak-report.json, soak.png.",
        ),
    ] = None,
    device: DeviceOpt = DeviceKind.mock,
    calrt_lib: CalrtLibOpt = None,
    time_scale: Annotated[
        float | None, typer.Option("--time-scale", help="Mock only: multiply the simulated job times (default 1).")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            min=0,
            help="Seeds the traffic mix (default 0); on the mock it also overrides the fault plan's seed.",
        ),
    ] = None,
    checkpoint_interval: Annotated[
        float, typer.Option("--checkpoint-interval", min=0.05, help="Seconds between checkpoint reports.")
    ] = 60.0,
    warmup_iterations: Annotated[
        int,
        typer.Option(
            "--warmup-iterations", min=0, help="Warm-up iterations per model after every load (after golden)."
        ),
    ] = 1,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", min=0.0, help="Seconds an unload may drain.")
    ] = 30.0,
    request_timeout: Annotated[
        float,
        typer.Option("--request-timeout", min=0.1, help="A request with no end after this long is a violation (hang)."),
    ] = 120.0,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    format: FormatOpt = Format.table,
) -> int:
    """Load/unload soak under mixed traffic (000 §19 M0/M4, 001 §13.3): every cycle loads the package (golden +
    warm-up before Ready), serves mixed traffic on every model, unloads, then checks per-chip memory against the
    baseline (drift limit max(64 MiB, 1 % local DRAM)), job counters, and that no token from another generation
    was delivered.

    Exit 0 no violation, 1 a violation (named: chip and drift, request and generation, ...), 2 usage,
    3 device error, 130 Ctrl-C (the evidence is written on every path).
    """
    from calctl.runners import soak as soak_lib

    if format is Format.junit:
        raise UsageError("--format junit: soak prints table or json")
    if (cycles is None) == (hours is None):
        raise UsageError("give exactly one of --cycles N and --hours H")
    spec = _device(device, calrt_lib, time_scale, fault_plan, seed if fault_plan is not None else None)
    seed = 0 if seed is None else seed
    path, trust, _ = resolve_package(pkg, trusted_key, allow_unsigned)
    out_dir = _report_dir(report, "calctl-soak")
    config = soak_lib.SoakConfig(
        package=path,
        trust=trust,
        device=spec,
        out_dir=out_dir,
        cycles=cycles,
        hours=hours,
        traffic=soak_lib.Traffic(traffic.value),
        traffic_seconds=traffic_seconds,
        clients_per_model=clients,
        inject=frozenset(soak_lib.Injection(i.value) for i in (inject or [])),
        seed=seed,
        checkpoint_interval_s=checkpoint_interval,
        warmup_iterations=warmup_iterations,
        drain_deadline_s=drain_timeout,
        request_timeout_s=request_timeout,
    )
    plan = f"{cycles} cycle(s)" if cycles is not None else f"{hours:g} hour(s)"
    _output.info(
        f"calctl soak: {plan} of {escape(str(path))} on the {spec.kind.value} device -> {escape(str(out_dir))}"
    )
    with _SoakProgress(config) as progress:
        result = soak_lib.run_soak(config, on_progress=progress.update)
    doc = result.document
    if format is Format.json:
        _output.emit_json(doc)
    else:
        _render_soak(doc)
    if result.exit_code != 0:
        for v in result.violations[:10]:
            _output.info(
                f"[bold red]violation[/] {escape(v['kind'])}: {escape(v['message'])}"
                + (f" (x{v['occurrences']})" if v["occurrences"] > 1 else "")
            )
    return result.exit_code


class _SoakProgress:
    """A rich progress bar on stderr: cycles (or hours), ETA, and live counters."""

    def __init__(self, config: Any) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._cycles = config.cycles
        self._total = float(config.cycles) if config.cycles is not None else float(config.hours * 3600)
        self._progress = Progress(
            TextColumn("[bold]soak[/]"),
            BarColumn(),
            TextColumn("{task.fields[done]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[live]}"),
            console=_output.stderr,
            transient=False,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("soak", total=self._total, done="", live="starting")

    def __enter__(self) -> _SoakProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, p: Any) -> None:
        if self._cycles is not None:
            completed, done = float(p.cycles_done), f"{p.cycles_done}/{self._cycles} cycles"
        else:
            completed, done = min(self._total, p.elapsed_s), f"{p.cycles_done} cycles"
        drift = " ".join(f"chip{c} {'n/a' if v is None else f'{v:+.0f}'}" for c, v in sorted(p.max_drift_mib.items()))
        live = (
            f"{p.phase} | gen {p.generation if p.generation is not None else '-'} | req {p.requests} ok {p.ok} "
            f"rejected {p.rejected} errors {p.errors} | violations {p.violations} | drift MiB {drift}"
        )
        self._progress.update(self._task, completed=completed, done=done, live=escape(live))


def _render_soak(doc: dict[str, Any]) -> None:
    out = _output.stdout
    req = doc["requests"]
    errs = doc["errors"]
    rows = [
        ("status", doc["status"]),
        ("cycles", f"{doc['cycles']}" + (f" of {doc['cycles_planned']}" if doc["cycles_planned"] else "")),
        ("duration", f"{doc['seconds']:.1f} s"),
        ("requests", f"{req['sent']} sent, " + ", ".join(f"{k} {v}" for k, v in sorted(req["by_outcome"].items()))),
        ("device errors", ", ".join(f"{k} {v}" for k, v in sorted(errs["device_errors"].items())) or "none"),
        (
            "lifecycle errors",
            ", ".join(f"{k} {v}" for k, v in sorted(errs["lifecycle"].items())) or "none (no AlreadyConfigured)",
        ),
        (
            "stale completions",
            f"{sum(errs['stale_completions_dropped'].values())} dropped by the engine, "
            f"{errs['stale_completions_delivered']} delivered",
        ),
        ("recoveries", str(len(errs["recoveries"]))),
    ]
    for chip, drift in sorted(doc["memory"]["max_drift_bytes"].items()):
        limit = doc["memory"]["drift_limit_bytes"].get(chip) or doc["memory"]["drift_limit_bytes"].get(int(chip))
        rows.append((f"chip{chip} max drift", f"{_mib(drift)} (limit {_mib(limit).lstrip('+')})"))
    _output.print_table("calctl soak", ["check", "result"], [(escape(a), escape(str(b))) for a, b in rows])
    if doc["violations"]:
        _output.print_table(
            "violations",
            ["kind", "cycle", "times", "message"],
            [(escape(v["kind"]), v["cycle"], v["occurrences"], escape(v["message"])) for v in doc["violations"]],
        )
    if doc.get("mock_result"):
        out.print(f"[yellow]{escape(MOCK_LABEL)}[/]")
    files = doc.get("files") or {}
    out.print(
        f"report: {escape(str(files.get('report')))}; events: {escape(str(files.get('events')))}; "
        f"plot: {escape(str(files.get('plot')))}"
    )
    verdict = "PASS" if doc.get("ok") else "FAIL"
    out.print(
        f"verdict {_output.styled_verdict(verdict)}: {len(doc['violations'])} violation(s) in {doc['cycles']} cycle(s)"
    )


# ---------------------------------------------------------------------------
# bench


class ModeOpt(str, enum.Enum):
    isolated = "isolated"
    joint = "joint"
    all = "all"


class TargetDeviceOpt(str, enum.Enum):
    unknown = "unknown"
    mock = "mock"
    calrt = "calrt"


def bench(
    pkg: Annotated[
        Path | None,
        typer.Argument(
            help="In-process scenarios (fault-isolation): package directory or "
            ".tar; default the bundled combined sample."
        ),
    ] = None,
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="ab (default; --mode), interference (001 §9.4), "
            "fault-isolation (001 §13.4, in-process on the mock), or "
            "another registered scenario (an unknown name lists them).",
        ),
    ] = "ab",
    url: Annotated[str | None, typer.Option("--url", help="The server to drive, e.g. http://127.0.0.1:8000.")] = None,
    models: Annotated[
        str | None, typer.Option("--models", help="A,B: the model aliases (B is measured against a saturated A).")
    ] = None,
    mode: Annotated[
        ModeOpt, typer.Option("--mode", help="isolated | joint | all (A alone, B alone, A+B, compared).")
    ] = ModeOpt.all,
    rate: Annotated[float, typer.Option("--rate", min=0.001, help="Requests per second per model (open loop).")] = 4.0,
    duration: Annotated[float, typer.Option("--duration", min=0.5, help="Seconds of arrivals per phase.")] = 10.0,
    burstiness: Annotated[
        float, typer.Option("--burstiness", min=0.01, help="Gamma shape of the inter-arrival times; 1 = Poisson.")
    ] = 1.0,
    prompt_len: Annotated[
        str, typer.Option("--prompt-len", help="N | uniform:LO:HI | normal:MEAN:STD | choice:a,b")
    ] = "uniform:8:64",
    output_len: Annotated[
        str, typer.Option("--output-len", help="max_tokens distribution, same forms.")
    ] = "uniform:8:48",
    slo_ttft: Annotated[
        float | None, typer.Option("--slo-ttft", min=0.0, help="TTFT SLO in seconds (goodput).")
    ] = None,
    slo_tpot: Annotated[
        float | None, typer.Option("--slo-tpot", min=0.0, help="TPOT SLO in seconds (goodput).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seeds arrivals, lengths, prompts and sampling.")] = 0,
    max_requests: Annotated[int, typer.Option("--max-requests", min=1, help="Cap per model and phase.")] = 10000,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", min=0.1, help="Seconds one request may take.")
    ] = 60.0,
    window: Annotated[
        float | None,
        typer.Option("--window", min=0.05, help="Steady-state window (s) for the CIs; default duration/10."),
    ] = None,
    token_range: Annotated[str, typer.Option("--token-range", help="LOW:HIGH prompt token ids.")] = "3:256",
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, max=2.0)] = 1.0,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="CALCTL_BENCH_API_KEY", help="Bearer key for the server.")
    ] = None,
    target_device: Annotated[
        TargetDeviceOpt, typer.Option("--target-device", help="What the server runs on, to label the report (SPEC §8).")
    ] = TargetDeviceOpt.unknown,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report", help="Report directory (default ./calctl-bench-<timestamp>): bench-report.json, bench.png."
        ),
    ] = None,
    device: DeviceOpt = DeviceKind.mock,
    calrt_lib: CalrtLibOpt = None,
    time_scale: Annotated[float | None, typer.Option("--time-scale", help="In-process scenarios, mock only.")] = None,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    format: FormatOpt = Format.table,
) -> int:
    """Load generator and A/B verdicts: open-loop streaming requests against an OpenAI-compatible server; TTFT,
    TPOT, ITL, E2E at P50/P90/P99, throughput, success rate, goodput; --mode all compares A and B isolated with
    A+B joint (overlap_ratio and throughput_efficiency with bootstrap CIs, P99 degradation, B success) against
    the 001 §13.2 gates. --scenario interference runs the four prefill/decode pairs; --scenario fault-isolation
    grades F0/F1/F2 in-process on the mock.

    Exit 0 gates pass (or only measured), 1 a gate failed (named) or fault isolation F0, 2 usage (also: server
    unreachable), 3 device error.
    """
    from calctl.runners.bench.base import BenchOptions, Mode
    from calctl.runners.bench.metrics import Slo
    from calctl.runners.bench.scenarios import SCENARIOS
    from calctl.runners.bench.workload import LengthDist, TokenRange

    if format is Format.junit:
        raise UsageError("--format junit: bench prints table or json")
    chosen = SCENARIOS.get(scenario)
    if chosen is None:
        raise UsageError(f"--scenario {scenario!r}: expected one of {', '.join(SCENARIOS)}")
    out_dir = _report_dir(report, "calctl-bench")
    model_list = tuple(m.strip() for m in (models or "").split(",") if m.strip())
    package, trust, spec = None, None, None
    if chosen.needs_url:
        if pkg is not None or time_scale is not None or device is not DeviceKind.mock:
            raise UsageError(
                f"--scenario {scenario} drives the server at --url: PKG, --device and --time-scale do not apply"
            )
    else:
        if url is not None:
            raise UsageError(f"--scenario {scenario} runs the engine in-process: --url does not apply")
        spec = _device(device, calrt_lib, time_scale)
        package, trust, _ = resolve_package(pkg, trusted_key, allow_unsigned)
    opts = BenchOptions(
        out_dir=out_dir,
        url=url,
        models=model_list,
        mode=Mode(mode.value),
        rate=rate,
        duration_s=duration,
        burstiness=burstiness,
        prompt=LengthDist.parse(prompt_len, name="prompt-len"),
        output=LengthDist.parse(output_len, name="output-len"),
        slo=Slo(slo_ttft, slo_tpot),
        seed=seed,
        max_requests=max_requests,
        request_timeout_s=request_timeout,
        window_s=window,
        token_range=TokenRange.parse(token_range),
        temperature=temperature,
        api_key=api_key,
        target_device=target_device.value if chosen.needs_url else "mock",
        package=package,
        trust=trust,
        device=spec,
    )
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    _output.info(
        f"calctl bench --scenario {scenario}"
        + (f" against {escape(url or '')}" if chosen.needs_url else " in-process on the mock board")
        + f" -> {escape(str(out_dir))}"
    )
    result = chosen.run(opts, lambda line: _output.info(escape(line)))
    doc = _bench_document(opts, result, scenario, started, time.perf_counter() - t0)
    _write_json(out_dir / "bench-report.json", doc)
    if format is Format.json:
        _output.emit_json(doc)
    else:
        _render_bench(result, doc)
    for note in result.notes:
        if note.startswith("failing gate"):
            _output.info(f"[bold red]{escape(note)}[/]")
    return result.exit_code


def _bench_document(opts: Any, result: Any, scenario: str, started: datetime, seconds: float) -> dict[str, Any]:
    mock = result.mock_result
    return {
        "command": "bench",
        "calctl_version": __version__,
        "started_at": started.isoformat(timespec="seconds"),
        "scenario": scenario,
        "verdict": result.verdict,
        "ok": result.exit_code == 0,
        "exit_code": result.exit_code,
        "seconds": round(seconds, 3),
        "device": opts.target_device,
        "mock_result": mock,
        "note": MOCK_LABEL
        if mock
        else (
            None
            if mock is False
            else "the server's device was not stated (--target-device); do not read these "
            "numbers as board evidence unless you know it"
        ),
        "target": {"url": opts.url, "models": list(opts.models)},
        "settings": {
            "mode": opts.mode.value,
            "rate_per_model": opts.rate,
            "duration_s": opts.duration_s,
            "burstiness": opts.burstiness,
            "prompt_len": opts.prompt.spec,
            "output_len": opts.output.spec,
            "slo_ttft_s": opts.slo.ttft_s,
            "slo_tpot_s": opts.slo.tpot_s,
            "seed": opts.seed,
            "max_requests": opts.max_requests,
            "request_timeout_s": opts.request_timeout_s,
            "window_s": opts.window_s,
            "temperature": opts.temperature,
            "token_range": [opts.token_range.low, opts.token_range.high],
        },
        "gates": [g.document() for g in result.gates],
        "failing_gates": [g.name for g in result.gates if g.passed is False],
        **result.body,
        "notes": list(result.notes),
        "files": {"report": str(opts.out_dir / "bench-report.json"), "plot": str(result.plot) if result.plot else None},
    }


def _render_bench(result: Any, doc: dict[str, Any]) -> None:
    for t in result.tables:
        _output.print_table(t.title, list(t.columns), [[escape(str(c)) for c in row] for row in t.rows])
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
    if doc.get("mock_result"):
        out.print(f"[yellow]{escape(MOCK_LABEL)}[/]")
    elif doc.get("note"):
        out.print(f"[yellow]{escape(doc['note'])}[/]")
    out.print(f"report: {escape(doc['files']['report'])}; plot: {escape(str(doc['files']['plot']))}")
    out.print(
        f"verdict {_output.styled_verdict(result.verdict)}"
        + (f": failing {escape(', '.join(doc['failing_gates']))}" if doc["failing_gates"] else "")
    )


def register(app: typer.Typer) -> None:
    app.command("soak")(soak)
    app.command("bench")(bench)


__all__ = ["register"]
