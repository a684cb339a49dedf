"""``calctl device build-reference`` and ``calctl device conformance``: the C ABI side of ``calctl device``.

* ``build-reference``: compile the reference board (C source shipped in the
  package, docs/calrt-c-abi.md §12) with the system C compiler; the library's
  path is the last line of the output.
* ``conformance``: run :mod:`calctl.runtime.conformance` against a C-ABI
  library (docs/calrt-c-abi.md §13) and render its rows and the graded vendor
  questions as a table, JSON or JUnit.

Thin: parse, call the library, render. Registered under ``calctl device`` by
``device_cmds.register``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._options import CalrtLibOpt, RunLevel, float_option
from calctl.cli._output import Format
from calctl.errors import UsageError

ConformanceFormatOpt = Annotated[
    Format,
    typer.Option("--format", "-f", help="Output format: table for people, json or junit (stdout) for machines."),
]


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
    level: Annotated[
        RunLevel,
        typer.Option(
            "--level",
            help="quick: every promise once (under 30 s on the reference board); standard: also a hung job held "
            "10 s and 2,000 jobs each against its twin; long: 10,000 jobs and the hung job held 60 s.",
        ),
    ] = RunLevel.STANDARD,
    check_timeout: Annotated[
        float, float_option("--check-timeout", min=1.0, help="Seconds each check may take before it is a TIMEOUT.")
    ] = 60.0,
    format: ConformanceFormatOpt = Format.table,
) -> int:
    """Check a CalRT C-ABI library against the ABI calctl needs (docs/calrt-c-abi.md), one call at a time.

    Each check ends PASS, FAIL (with the call, its arguments and what came back), UNSUPPORTED (the
    library answered NOT_SUPPORTED; never a pass) or TIMEOUT (each check runs in a child process, killed
    after --check-timeout). Then the vendor questions of 000 §20 / 001 §15.2 the ABI can reach, graded
    C0 (measured here), C1 (symbol present, behaviour not shown) or C4 (refused).
    A library that loads but fails calctl's ABI gate (a missing symbol, another ABI version) is the
    abi_version check's FAIL row, and no other check runs.
    --level quick tries every promise once; standard (the default) also holds a hung job past any plausible
    shim watchdog and runs thousands of jobs on both chips, each output against its twin; long runs more.
    A FAIL row names the ABI clauses (docs/calrt-c-abi.md §13) the check tries.
    Exit 0 no FAIL or TIMEOUT, 1 a check failed or timed out, 2 usage, 3 the file is missing or not a
    loadable library.
    """
    from calctl.runners.conformance import run_conformance
    from calctl.runtime.conformance import CHECK_NAMES

    if calrt_lib is None:
        raise UsageError(
            "device conformance needs the library to check", hint="pass --calrt-lib PATH or set CALRT_LIBRARY"
        )
    unknown = [c for c in check or [] if c not in CHECK_NAMES]
    if unknown:
        raise UsageError(f"--check {unknown[0]}: no such check", hint=f"checks: {', '.join(CHECK_NAMES)}")

    def progress(r: Any) -> None:
        _output.info(f"  {_output.styled_verdict(r.verdict.value)} {r.name} ({r.seconds:.2f} s)")

    result = run_conformance(
        calrt_lib, package=package, level=level.value, checks=check, check_timeout=check_timeout, on_result=progress
    )
    doc = result.document()
    if format is Format.json:
        _output.emit_json(result)
    elif format is Format.junit:
        print(conformance_junit(doc), end="")
    else:
        _render_conformance(doc)
    return result.exit_code


def _render_conformance(doc: dict[str, Any]) -> None:
    _output.stdout.print(
        f"library [bold]{doc['library']}[/]: C ABI {doc['abi']}; extensions: {', '.join(doc['extensions']) or 'none'}; "
        f"package {doc['package']}; level {doc.get('level', 'standard')}"
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
                + (f" [dim](clauses {', '.join(c.get('clauses') or [])})[/]" if c["verdict"] == "FAIL" else "")
            )
    _output.print_table(
        "vendor questions (000 §20, 001 §15.2)",
        ["question", "grade", "answer", "evidence", "ask the vendor", "source"],
        [
            [
                q["question"],
                _output.styled_verdict(q["grade"]),
                q["answer"],
                q["evidence"],
                q.get("ask") or "",
                q["source"],
            ]
            for q in doc["vendor_questions"]
        ],
    )
    style = "yellow" if doc.get("device_label") == "software model" else "dim"
    _output.stdout.print(f"[{style}]{escape(doc['note'])}[/]")
    counts = ", ".join(f"{n} {k}" for k, n in doc["counts"].items() if n)
    _output.stdout.print(f"verdict {_output.styled_verdict(doc['verdict'])} ({counts})")


def conformance_junit(doc: dict[str, Any]) -> str:
    """One testcase per check: FAIL a failure, TIMEOUT an error, UNSUPPORTED skipped (never a pass)."""
    props = [(name, str(doc[name])) for name in ("library", "abi", "package")] + [
        (f"vendor: {q['question']}", f"{q['grade']}: {q['answer']}") for q in doc["vendor_questions"]
    ]
    cases = [
        _output.JunitCase(
            name=c["name"],
            classname="calctl.device.conformance",
            seconds=c["seconds"],
            outcome=_output.junit_outcome(c["verdict"]),
            message=f"UNSUPPORTED: {c['detail']}" if c["verdict"] == "UNSUPPORTED" else c["detail"],
            kind={"FAIL": "fail", "TIMEOUT": "timeout"}.get(c["verdict"], ""),
            text=c["detail"]
            + (f"\ncall {c['call']}({c['arguments'] or ''}) returned {c['returned']}" if c["call"] else ""),
            output=c["detail"],
        )
        for c in doc["checks"]
    ]
    return _output.junit_xml(
        "calctl device conformance", [_output.JunitSuite("calctl.device.conformance", cases, props)]
    )


def register(device_app: typer.Typer) -> None:
    device_app.command("build-reference")(build_reference)
    device_app.command("conformance")(conformance)
