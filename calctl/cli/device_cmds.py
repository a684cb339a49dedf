"""``calctl device``: look at the board through the runtime layer (SPEC §5, 001 §14).

* ``info``: pick the board from the environment (``select_board``:
  CALCTL_BOARD_ID, CALCTL_MOCK_SEED, CALRT_DEVICE), open it with
  ``open_runtime``, read topology, versions, per-chip memory, counters and
  health, render. A figure the runtime cannot provide is shown as
  ``null``/"n/a", never 0. It configures and runs nothing.
* ``build-reference``: compile the reference board (C source shipped in the
  package) with the system C compiler; the library's path is the last line.
* ``conformance``: run :mod:`calctl.runtime.conformance` against a C-ABI
  library and render its rows and the graded vendor questions.
"""

from __future__ import annotations

import contextlib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Annotated, Any

import typer

from calctl.cli import _output
from calctl.cli._options import CalrtLibOpt, DeviceKind, DeviceOpt, FormatOpt
from calctl.cli._output import Format
from calctl.errors import UsageError
from calctl.runtime import BoardSelection, Runtime, open_runtime, select_board

MOCK_NOTE = "mock device: a simulated board; its results are mock results, not evidence about hardware (SPEC §8)"


def info_document(rt: Runtime, library: str | None, board: BoardSelection | None = None) -> dict[str, Any]:
    """The ``device info`` document: one entry per chip, ``None`` where the runtime cannot tell."""
    topo = rt.topology()
    memory = {m.chip: m for m in rt.memory_usage()}
    counters = {c.chip: c for c in rt.counters()}
    health = {h.chip: h for h in rt.health()}
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
    }


def info(
    device: DeviceOpt = DeviceKind.mock,
    calrt_lib: CalrtLibOpt = None,
    format: FormatOpt = Format.table,
) -> None:
    """Show the board: identity, topology, versions, per-chip memory, job counters and health.

    The board comes from the environment: CALCTL_BOARD_ID and CALCTL_MOCK_SEED for the mock,
    CALRT_DEVICE (handed to the vendor shim) for CalRT.
    """
    lib = str(calrt_lib) if device is DeviceKind.calrt and calrt_lib is not None else None
    board = select_board(device.value)
    if device is DeviceKind.mock:
        rt_cm = open_runtime(device.value, **board.mock_options())
    else:
        rt_cm = open_runtime(device.value, calrt_lib=lib)
    with rt_cm as rt:
        doc = info_document(rt, lib, board)
    if format is Format.json:
        _output.emit_json(doc)
        return
    v = doc["versions"]
    _output.stdout.print(
        f"device [bold]{doc['device']}[/]: {doc['topology']['chips']} chips x {doc['topology']['calcores_per_chip']} CalCores; "
        f"runtime {v.runtime}, driver {v.driver}, firmware {v.firmware}, C ABI {v.abi}"
        + (f"; library {lib}" if lib else "")
    )
    b = doc["board"]
    if device is DeviceKind.mock:
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
        ["chip", "CalCores", "DRAM bytes", "used bytes", "pending", "finished", "failed", "health"],
        [
            [
                c["chip"],
                c["calcores"],
                n(c["dram_bytes"]),
                n(c["memory_used_bytes"]),
                n(c["pending"]),
                n(c["finished"]),
                n(c["failed"]),
                c["health"] + (f" ({c['health_detail']})" if c["health_detail"] else ""),
            ]
            for c in doc["chips"]
        ],
    )


def build_reference(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Directory for the library. Default: the calctl cache ($CALCTL_CACHE_DIR), keyed by source digest.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if an identical build exists.")] = False,
) -> None:
    """Build the reference board: a C library implementing the CalRT C ABI that really computes.

    Compiles the C source shipped in calctl with $CC, cc or gcc. The last line of the output is the
    library's path, for --calrt-lib or CALRT_LIBRARY. Exit 0 built or reused, 2 no compiler or the build failed.
    """
    from calctl.runtime._native.build import build_reference as build

    result = build(out, force=force)
    _output.stdout.print(f"[dim]{' '.join(result.command)}[/]")
    _output.stdout.print(
        f"reference board {'reused (same sources)' if result.reused else 'built'}; source digest {result.digest[:16]}"
    )
    print(result.library, flush=True)  # the last line: just the path, no markup


CheckOpt = Annotated[
    list[str] | None,
    typer.Option("--check", help="Run only this check (repeatable). Default: every check."),
]


def conformance(
    calrt_lib: CalrtLibOpt = None,
    package: Annotated[
        Path | None,
        typer.Option(
            "--package", help="Package the checks load (directory or .tar). Default: the bundled combined sample."
        ),
    ] = None,
    check: CheckOpt = None,
    check_timeout: Annotated[
        float, typer.Option("--check-timeout", min=1.0, help="Seconds each check may take before it is a TIMEOUT.")
    ] = 60.0,
    format: FormatOpt = Format.table,
) -> int:
    """Check a CalRT C-ABI library against the ABI calctl needs (docs/calrt-c-abi.md), one call at a time.

    Each check ends PASS, FAIL (with the call, its arguments and what came back), UNSUPPORTED (the
    library answered NOT_SUPPORTED; never a pass) or TIMEOUT (each check runs in a child process, killed
    after --check-timeout). Then the vendor questions of 000 §20 / 001 §15.2 the ABI can reach, graded
    C0 (measured here), C1 (symbol present, behaviour not shown) or C4 (refused).
    Exit 0 no FAIL or TIMEOUT, 1 a check failed or timed out, 2 usage, 3 the library cannot be loaded.
    """
    from calctl.compiler.bundled import bundled_package
    from calctl.package.reader import package_root
    from calctl.runtime import DeviceKind as RuntimeDeviceKind
    from calctl.runtime._native.lib import load_library
    from calctl.runtime.conformance import CHECK_NAMES, Target, run_suite, vendor_questions

    if calrt_lib is None:
        raise UsageError(
            "device conformance needs the library to check", hint="pass --calrt-lib PATH or set CALRT_LIBRARY"
        )
    unknown = [c for c in check or [] if c not in CHECK_NAMES]
    if unknown:
        raise UsageError(f"--check {unknown[0]}: no such check", hint=f"checks: {', '.join(CHECK_NAMES)}")
    library = load_library(calrt_lib)  # exit 3 here, naming the path and the missing symbol
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(package_root(package)) if package is not None else bundled_package("combined")
        target = Target(RuntimeDeviceKind.CALRT, Path(root).resolve(), Path(calrt_lib).resolve())

        def progress(r: Any) -> None:
            _output.info(f"  {_output.styled_verdict(r.verdict.value)} {r.name} ({r.seconds:.2f} s)")

        report = run_suite(target, check, check_timeout=check_timeout, on_result=progress)
    answers = vendor_questions(report.results)
    verdict = "PASS" if report.passed else "FAIL"
    doc = {
        "command": "device conformance",
        "device": "calrt",
        "library": str(calrt_lib),
        "abi": f"{library.abi[0]}.{library.abi[1]}",
        "extensions": sorted(library.extensions),
        "package": str(package) if package is not None else "bundled combined sample",
        "verdict": verdict,
        "counts": report.counts(),
        "checks": [r.to_dict() for r in report.results],
        "vendor_questions": [a.to_dict() for a in answers],
        "note": GRADE_NOTE.format(library=calrt_lib),
    }
    if format is Format.json:
        _output.emit_json(doc)
    elif format is Format.junit:
        print(conformance_junit(doc), end="")
    else:
        _render_conformance(doc)
    return 0 if report.passed else 1


GRADE_NOTE = (
    "grades describe the library {library} as measured here (001 §1: C0 measured, C1 symbol present but behaviour "
    "not shown, C4 refused); they are evidence about a Calculet board only when that library drives one"
)


def _render_conformance(doc: dict[str, Any]) -> None:
    _output.stdout.print(
        f"library [bold]{doc['library']}[/]: C ABI {doc['abi']}; extensions: {', '.join(doc['extensions']) or 'none'}; "
        f"package {doc['package']}"
    )
    _output.print_table(
        "conformance",
        ["check", "verdict", "seconds", "detail"],
        [[c["name"], _output.styled_verdict(c["verdict"]), f"{c['seconds']:.2f}", c["detail"]] for c in doc["checks"]],
    )
    for c in doc["checks"]:
        if c["verdict"] in ("FAIL", "UNSUPPORTED") and (c["call"] or c["returned"]):
            _output.stdout.print(
                f"[bold]{c['name']}[/] {c['verdict']}: call {c['call']}({c['arguments'] or ''}) returned {c['returned']}"
            )
    _output.print_table(
        "vendor questions (000 §20, 001 §15.2)",
        ["question", "grade", "answer", "evidence", "source"],
        [[q["question"], q["grade"], q["answer"], q["evidence"], q["source"]] for q in doc["vendor_questions"]],
    )
    _output.stdout.print(f"[dim]{doc['note']}[/]")
    counts = ", ".join(f"{n} {k}" for k, n in doc["counts"].items() if n)
    _output.stdout.print(f"verdict {_output.styled_verdict(doc['verdict'])} ({counts})")


def conformance_junit(doc: dict[str, Any]) -> str:
    """One testcase per check: FAIL a failure, TIMEOUT an error, UNSUPPORTED skipped (never a pass)."""
    root = ET.Element("testsuites", name="calctl device conformance")
    suite = ET.SubElement(root, "testsuite", name="calctl.device.conformance")
    props = ET.SubElement(suite, "properties")
    for name, value in (("library", doc["library"]), ("abi", doc["abi"]), ("package", doc["package"])):
        ET.SubElement(props, "property", name=name, value=str(value))
    for q in doc["vendor_questions"]:
        ET.SubElement(props, "property", name=f"vendor: {q['question']}", value=f"{q['grade']}: {q['answer']}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for c in doc["checks"]:
        case = ET.SubElement(
            suite, "testcase", classname="calctl.device.conformance", name=c["name"], time=f"{c['seconds']:.4f}"
        )
        counts["tests"] += 1
        text = c["detail"] + (
            f"\ncall {c['call']}({c['arguments'] or ''}) returned {c['returned']}" if c["call"] else ""
        )
        if c["verdict"] == "FAIL":
            ET.SubElement(case, "failure", message=c["detail"], type="fail").text = text
            counts["failures"] += 1
        elif c["verdict"] == "TIMEOUT":
            ET.SubElement(case, "error", message=c["detail"], type="timeout").text = text
            counts["errors"] += 1
        elif c["verdict"] == "UNSUPPORTED":
            ET.SubElement(case, "skipped", message=f"UNSUPPORTED: {c['detail']}")
            counts["skipped"] += 1
        ET.SubElement(case, "system-out").text = c["detail"]
    for k, v in counts.items():
        suite.set(k, str(v))
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def register(app: typer.Typer) -> None:
    device_app = typer.Typer(help="Look at the board (mock by default, or CalRT).", no_args_is_help=True)
    device_app.command("info")(info)
    device_app.command("build-reference")(build_reference)
    device_app.command("conformance")(conformance)
    app.add_typer(device_app, name="device")
