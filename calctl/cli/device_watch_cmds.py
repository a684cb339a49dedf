"""``calctl device watch``: the board's per-chip telemetry, live (docs/watch.md; 001 §14, docs/calrt-c-abi.md §15).

Thin: open the board (a DeviceSpec, as ``device check`` does), read ``rt.telemetry()`` every ``--interval``
seconds, and show it: a refreshing table on a terminal (a table per sample when piped), ``--format jsonl`` one
JSON line per sample for logs, ``--prometheus PORT`` the same per-chip gauges and counters ``calctl serve``
exports on ``/metrics``, for a board that is not serving. It ends after ``--count`` samples or ``--seconds``,
else on Ctrl-C (exit 130). A figure the runtime cannot tell is ``null``/n/a, never 0. It holds the board while
it watches (one device per process): it does not run alongside ``calctl serve`` on the same board.
"""

from __future__ import annotations

import enum
import json
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any

import typer

from calctl.cli import _output
from calctl.cli._options import CalrtLibOpt, DeviceChoice, DeviceOpt, FaultPlanOpt, SeedOpt, float_option, int_option
from calctl.errors import UsageError

if TYPE_CHECKING:
    from calctl.runtime.types import ChipTelemetry


class WatchFormat(str, enum.Enum):
    table = "table"
    jsonl = "jsonl"


IntervalOpt = Annotated[float, float_option("--interval", min=0.05, help="Seconds between samples (default 1).")]
CountOpt = Annotated[int | None, int_option("--count", min=1, help="Stop after this many samples.")]
SecondsOpt = Annotated[float | None, float_option("--seconds", min=0.0, help="Stop after this many seconds.")]
PrometheusOpt = Annotated[
    int | None,
    int_option(
        "--prometheus",
        min=1,
        max=65535,
        help="Serve the per-chip gauges and counters on http://0.0.0.0:PORT/metrics while watching.",
    ),
]
WatchFormatOpt = Annotated[
    WatchFormat, typer.Option("--format", help="table: a live per-chip table; jsonl: one JSON line per sample.")
]

COLUMNS = ["chip", "temp °C", "limit", "power W", "cap", "MHz", "throttle", "throttled s", "ECC corr", "ECC uncorr"]


def sample_document(device: str, tel: tuple[ChipTelemetry, ...]) -> dict[str, Any]:
    """One sample: when, which device, every chip's telemetry (``null`` and a vendor gap where not reported)."""
    return {
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "device": device,
        "simulated": device == "mock",
        "chips": [{"chip": t.chip, **t.document()} for t in tel],
    }


def _row(t: ChipTelemetry) -> list[str]:
    def n(v: Any, fmt: str = "{:g}") -> str:
        return "n/a" if v is None else fmt.format(v)

    reasons = "n/a" if t.throttle_reasons is None else (",".join(t.throttle_reasons) or "no")
    return [
        str(t.chip),
        n(t.temperature_c, "{:.1f}"),
        n(t.temperature_limit_c),
        n(t.power_w, "{:.1f}"),
        n(t.power_limit_w),
        n(t.frequency_mhz),
        reasons,
        n(t.throttled_s, "{:.1f}"),
        n(t.ecc_correctable),
        n(t.ecc_uncorrectable),
    ]


def _table(title: str, tel: tuple[ChipTelemetry, ...]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for c in COLUMNS:
        table.add_column(c)
    for t in tel:
        table.add_row(*_row(t))
    return table


def _serve_metrics(port: int, latest: list[tuple[ChipTelemetry, ...]]) -> Any:
    """A Prometheus endpoint over the latest sample (the families ``calctl serve`` exports per chip)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from calctl.serving.engine.metrics import chip_telemetry_families

    class _Latest:
        def collect(self) -> Any:
            return chip_telemetry_families([(t.chip, t) for t in (latest[0] if latest else ())])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Latest())
    try:
        return start_http_server(port, registry=registry)
    except OSError as exc:
        raise UsageError(f"--prometheus {port}: cannot listen on the port: {exc.strerror or exc}") from None


def watch(
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    fault_plan: FaultPlanOpt = None,
    seed: SeedOpt = None,
    interval: IntervalOpt = 1.0,
    count: CountOpt = None,
    seconds: SecondsOpt = None,
    prometheus: PrometheusOpt = None,
    format: WatchFormatOpt = WatchFormat.table,
) -> int:
    """Watch each chip's temperature, power, clock, throttling and ECC counters, live.

    A refreshing table on a terminal; --format jsonl writes one JSON line per sample (for logs);
    --prometheus PORT serves the per-chip gauges and counters of `calctl serve`'s /metrics for a board
    that is not serving. Stops after --count samples or --seconds, else on Ctrl-C (exit 130). Fields the
    runtime cannot report are n/a (null), never 0 (docs/calrt-c-abi.md §15). Exit 3: no device.
    """
    from calctl.cli._device import device_spec
    from calctl.cli._signals import interruptible

    spec = device_spec(device, calrt_lib, None, fault_plan, seed)
    latest: list[tuple[ChipTelemetry, ...]] = []
    t0 = time.monotonic()
    n = 0
    with interruptible(), spec.open(sample=False) as rt:
        server = _serve_metrics(prometheus, latest) if prometheus is not None else None
        label = f"{rt.kind.value} device" + (
            " (simulated: mock numbers, not a board's)" if rt.kind.value == "mock" else ""
        )
        if server is not None:
            _output.info(f"serving per-chip telemetry on http://0.0.0.0:{prometheus}/metrics")
        live = None
        if format is WatchFormat.table and _output.stdout.is_terminal:
            from rich.live import Live

            live = Live(console=_output.stdout, auto_refresh=False)
            live.start()
        try:
            while True:
                tel = rt.telemetry()
                latest[:] = [tel]
                n += 1
                if format is WatchFormat.jsonl:
                    _output.stdout.out(json.dumps(sample_document(rt.kind.value, tel)), highlight=False)
                else:
                    title = f"{label}: sample {n}, {time.monotonic() - t0:.1f} s"
                    if live is not None:
                        live.update(_table(title, tel), refresh=True)
                    else:
                        _output.print_table(title, COLUMNS, [_row(t) for t in tel])
                if (count is not None and n >= count) or (seconds is not None and time.monotonic() - t0 >= seconds):
                    break
                time.sleep(interval)
        finally:
            if live is not None:
                live.stop()
            if server is not None:
                server[0].shutdown()
    gaps = sorted({g for t in latest[0] for g in t.gaps}) if latest else []
    if gaps and format is WatchFormat.table:
        _output.info("vendor gaps: " + "; ".join(gaps))
    return 0


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)
