"""``calctl device``: look at the board through the runtime layer (docs/runtime.md, 001 §14).

Thin: pick the board from the environment (``select_board``: CALCTL_BOARD_ID,
CALCTL_MOCK_SEED, CALRT_DEVICE), open it with ``open_runtime``, read topology,
versions, per-chip memory, counters and health, render. A figure the runtime
cannot provide is shown as ``null``/"n/a", never 0. Nothing here configures or
runs anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._options import CalrtLibOpt, DeviceChoice, DeviceOpt, FormatOpt
from calctl.cli._output import TableJson
from calctl.report import simple_report

if TYPE_CHECKING:  # calctl.runtime loads numpy and the package reader: only when a device command runs
    from calctl.runtime import BoardSelection, Runtime

MOCK_NOTE = (
    "mock device: a simulated board; its results are mock results, not evidence about hardware (docs/runtime.md §5)"
)


def info_document(rt: Runtime, library: str | None, board: BoardSelection | None = None) -> dict[str, Any]:
    """The ``device info`` document: one entry per chip, ``None`` where the runtime cannot tell."""
    from calctl.runtime.memory_figures import memory_findings

    topo = rt.topology()
    readings = rt.memory_usage()
    memory = {m.chip: m for m in readings}
    counters = {c.chip: c for c in rt.counters()}
    health = {h.chip: h for h in rt.health()}
    telemetry = {t.chip: t for t in rt.telemetry()}
    chips = []
    for c in range(topo.chips):
        chips.append(
            {
                "chip": c,
                "calcores": topo.calcores_per_chip,
                "dram_bytes": topo.dram_bytes[c],
                "memory_used_bytes": memory[c].used_bytes,
                "memory_total_bytes": memory[c].total_bytes,
                "pending": counters[c].pending,
                "finished": counters[c].finished,
                "failed": counters[c].failed,
                "health": health[c].health.value,
                "health_detail": health[c].detail,
                # 001 §14: null and a listed vendor gap where the runtime cannot tell, never 0 or omitted
                "telemetry": telemetry[c].document() if c in telemetry else _no_telemetry(),
            }
        )
    return {
        "device": rt.kind.value,
        "simulated": rt.kind.value == "mock",
        "note": MOCK_NOTE if rt.kind.value == "mock" else None,
        "library": library,
        "board": board.describe() if board is not None else None,
        "versions": rt.versions(),
        "topology": {"chips": topo.chips, "calcores_per_chip": topo.calcores_per_chip},
        "chips": chips,
        # C ABI MEM-1: figures that cannot be bytes of their chip (KiB, another chip's) are a FAIL, exit 1
        "memory_findings": [f.text() for f in memory_findings(topo, readings)],
    }


def _no_telemetry() -> dict[str, Any]:
    from calctl.runtime.types import TELEMETRY_FIELDS

    return {
        **dict.fromkeys(TELEMETRY_FIELDS),
        "vendor_gaps": [f"{f}: the runtime reported no telemetry for this chip" for f in TELEMETRY_FIELDS],
    }


def info(
    device: DeviceOpt = DeviceChoice.mock,
    calrt_lib: CalrtLibOpt = None,
    format: FormatOpt = TableJson.table,
) -> int:
    """Show the board: identity, topology, versions, per-chip memory, job counters and health.

    The board comes from the environment: CALCTL_BOARD_ID and CALCTL_MOCK_SEED for the mock,
    CALRT_DEVICE (handed to the vendor shim) for CalRT. Memory figures that cannot be bytes of their
    chip (a total other than the topology's DRAM, used beyond it) are a FAIL naming the call: exit 1.
    """
    from calctl.runtime import open_runtime, select_board
    from calctl.runtime.types import TELEMETRY_FIELDS

    lib = str(calrt_lib) if device is DeviceChoice.calrt and calrt_lib is not None else None
    board = select_board(device.value)
    if device is DeviceChoice.mock:
        rt_cm = open_runtime(device.value, **board.mock_options())
    else:
        rt_cm = open_runtime(device.value, calrt_lib=lib)
    with rt_cm as rt:
        doc = info_document(rt, lib, board)
    verdict = "FAIL" if doc["memory_findings"] else "PASS"
    report = simple_report(
        "device info", doc, verdict=verdict, device=doc["device"], device_options=None, versions=doc["versions"]
    )
    if _output.is_json(format):
        _output.emit_json(report)
        return report.exit_code
    v = doc["versions"]
    _output.stdout.print(
        f"device [bold]{doc['device']}[/]: {doc['topology']['chips']} chips x {doc['topology']['calcores_per_chip']} CalCores; "
        f"runtime {v.runtime}, driver {v.driver}, firmware {v.firmware}, C ABI {v.abi}"
        + (f"; library {lib}" if lib else "")
    )
    b = doc["board"]
    if device is DeviceChoice.mock:
        _output.stdout.print(
            f"board [bold]{b['id']}[/] (from {b['source']}), fault seed {b['seed']} ({b['seed_source']})"
        )
    else:
        selector = b["selector"] or "unset: the shim's default device"
        _output.stdout.print(
            f"board [bold]{b['id']}[/] (from {b['source']}), CALRT_DEVICE {selector}; [yellow]not confirmed[/]: "
            "the 0.7.6 C ABI cannot report which board the shim opened"
        )
    if doc["note"]:
        _output.stdout.print(f"[yellow]{doc['note']}[/]")

    def n(value: Any) -> str:
        return "n/a" if value is None else str(value)

    _output.print_table(
        None,
        ["chip", "CalCores", "DRAM", "used", "pending", "finished", "failed", "health"],
        [
            [
                c["chip"],
                c["calcores"],
                _output.mib(c["dram_bytes"]),
                _output.mib(c["memory_used_bytes"]),
                n(c["pending"]),
                n(c["finished"]),
                n(c["failed"]),
                c["health"] + (f" ({c['health_detail']})" if c["health_detail"] else ""),
            ]
            for c in doc["chips"]
        ],
    )
    _output.print_table(
        "telemetry (001 §14; n/a = the runtime cannot tell, see vendor gaps)",
        ["chip", "temp °C", "power W", "freq MHz", "throttled", "resets", "queue"],
        [[c["chip"], *(n(c["telemetry"][f]) for f in TELEMETRY_FIELDS)] for c in doc["chips"]],
    )
    gaps = sorted({g for c in doc["chips"] for g in c["telemetry"]["vendor_gaps"]})
    if gaps:
        _output.stdout.print("vendor gaps: " + "; ".join(gaps))
    for finding in doc["memory_findings"]:
        _output.stdout.print(f"{_output.styled_verdict('FAIL')} {escape(finding)}")
    return report.exit_code


def register(app: typer.Typer) -> None:
    device_app = typer.Typer(help="Look at the board (mock by default, or CalRT).", no_args_is_help=True)
    device_app.command("info")(info)
    from calctl.cli import device_native_cmds  # build-reference, conformance (the C ABI, docs/calrt-c-abi.md §12-13)

    device_native_cmds.register(device_app)
    from calctl.cli import device_board_cmds  # check, reset (the board under the model, docs/deploy.md)

    device_board_cmds.register(device_app)
    from calctl.cli import fleet_cmds  # list (the boards of the host, docs/boards.md)

    fleet_cmds.register_device(device_app)
    app.add_typer(device_app, name="device")
