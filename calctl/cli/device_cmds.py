"""``calctl device``: look at the board through the runtime layer (SPEC §5, 001 §14).

Thin: open the device with ``open_runtime``, read topology, versions, per-chip
memory, counters and health, render. A figure the runtime cannot provide is
shown as ``null``/"n/a", never 0. Nothing here configures or runs anything.
"""

from __future__ import annotations

from typing import Any

import typer

from calctl.cli import _output
from calctl.cli._options import CalrtLibOpt, DeviceKind, DeviceOpt, FormatOpt
from calctl.cli._output import Format
from calctl.runtime import Runtime, open_runtime

MOCK_NOTE = "mock device: a simulated board; its results are mock results, not evidence about hardware (SPEC §8)"


def info_document(rt: Runtime, library: str | None) -> dict[str, Any]:
    """The ``device info`` document: one entry per chip, ``None`` where the runtime cannot tell."""
    topo = rt.topology()
    memory = {m.chip: m for m in rt.memory_usage()}
    counters = {c.chip: c for c in rt.counters()}
    health = {h.chip: h for h in rt.health()}
    chips = []
    for c in range(topo.chips):
        chips.append({
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
        })
    return {
        "device": rt.kind.value,
        "simulated": rt.kind.value == "mock",
        "note": MOCK_NOTE if rt.kind.value == "mock" else None,
        "library": library,
        "versions": rt.versions(),
        "topology": {"chips": topo.chips, "calcores_per_chip": topo.calcores_per_chip},
        "chips": chips,
    }


def info(
    device: DeviceOpt = DeviceKind.mock,
    calrt_lib: CalrtLibOpt = None,
    format: FormatOpt = Format.table,
) -> None:
    """Show the board: topology, versions, per-chip memory, job counters and health."""
    lib = str(calrt_lib) if device is DeviceKind.calrt and calrt_lib is not None else None
    with open_runtime(device.value, calrt_lib=lib if device is DeviceKind.calrt else None) as rt:
        doc = info_document(rt, lib)
    if format is Format.json:
        _output.emit_json(doc)
        return
    v = doc["versions"]
    _output.stdout.print(
        f"device [bold]{doc['device']}[/]: {doc['topology']['chips']} chips x {doc['topology']['calcores_per_chip']} CalCores; "
        f"runtime {v.runtime}, driver {v.driver}, firmware {v.firmware}, C ABI {v.abi}"
        + (f"; library {lib}" if lib else "")
    )
    if doc["note"]:
        _output.stdout.print(f"[yellow]{doc['note']}[/]")

    def n(value: Any) -> str:
        return "n/a" if value is None else str(value)

    _output.print_table(
        None,
        ["chip", "CalCores", "DRAM bytes", "used bytes", "pending", "finished", "failed", "health"],
        [
            [c["chip"], c["calcores"], n(c["dram_bytes"]), n(c["memory_used_bytes"]), n(c["pending"]), n(c["finished"]),
             n(c["failed"]), c["health"] + (f" ({c['health_detail']})" if c["health_detail"] else "")]
            for c in doc["chips"]
        ],
    )


def register(app: typer.Typer) -> None:
    device_app = typer.Typer(help="Look at the board (mock by default, or CalRT).", no_args_is_help=True)
    device_app.command("info")(info)
    app.add_typer(device_app, name="device")
