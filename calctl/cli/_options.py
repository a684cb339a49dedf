"""Shared ``Annotated`` options, so every command spells them the same way.

``FormatOpt`` (table | json) is what a command that prints a document takes;
``ResultFormatOpt`` (table | json | junit) only the commands whose output is a
list of test results (``validate`` and the device runners), so each format is
offered exactly where it works. Nothing here does any work.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import typer

from calctl.cli._output import Format, TableJson


class DeviceKind(str, enum.Enum):
    mock = "mock"
    calrt = "calrt"


class RunLevel(str, enum.Enum):
    """``--level`` of ``bringup`` and ``accept``: the values of ``calctl.runners.bringup.Level`` (which
    ``calctl.runners.acceptance`` uses too; a unit test keeps them equal), spelled here so that a command's
    ``--help`` imports no runner; the command turns it into the library's own enum."""

    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"


FormatOpt = Annotated[
    TableJson,
    typer.Option("--format", "-f", help="Output format: table for people, json (one document on stdout) for machines."),
]
ResultFormatOpt = Annotated[
    Format,
    typer.Option(
        "--format",
        "-f",
        help="Output format: table for people, json (one document on stdout), junit (JUnit XML for CI test reports).",
    ),
]

DeviceOpt = Annotated[
    DeviceKind,
    typer.Option(
        "--device", help="mock (embedded simulated board, default) or calrt (real board via the CalRT C ABI)."
    ),
]
CalrtLibOpt = Annotated[
    Path | None,
    typer.Option(
        "--calrt-lib", envvar="CALRT_LIBRARY", help="Path of the CalRT C-ABI shim library (also CALRT_LIBRARY)."
    ),
]
TrustedKeyOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--trusted-key",
        help="Ed25519 public key (PEM) trusted to sign packages; repeatable. A directory of keys comes from "
        "CALCTL_TRUSTED_KEYS.",
    ),
]
AllowUnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned", help="Accept an unsigned or untrusted package, reported as a warning (never silently)."
    ),
]
TimeScaleOpt = Annotated[
    float | None,
    typer.Option(
        "--time-scale",
        help="Mock only: multiply the simulated job times (default 1; the PoC's own default is in its help).",
    ),
]
FaultPlanOpt = Annotated[
    Path | None,
    typer.Option(
        "--fault-plan",
        help="Mock only: a calctl-fault-plan/v1 YAML of injected faults (docs/runtime.md, fault plans).",
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        "--seed",
        min=0,
        help="Seed of what is random in the run: on the mock it overrides the fault plan's seed; soak and bench "
        "also seed their traffic with it (default 0).",
    ),
]
SerializeChipsOpt = Annotated[
    bool,
    typer.Option("--serialize-chips", help="Mock only: a global runtime lock, so the chips never overlap (S1)."),
]
ReportFileOpt = Annotated[
    Path | None, typer.Option("--report", help="Write the JSON report here (on every path, a hang included).")
]
JobsOpt = Annotated[int | None, typer.Option("--jobs", "-j", min=1, max=256, help="Hashing threads (default: cores).")]


def _report_default(default: str) -> str:
    """``./calctl-reports/soak-<timestamp>`` as words a help column can wrap: a new ``soak-TIMESTAMP`` under it."""
    parent, _, name = default.rpartition("/")
    return f"a new {name.replace('<timestamp>', 'TIMESTAMP')} directory under {parent}" if parent else default


def report_dir_option(default: str, contents: str) -> Any:
    """``--report DIR`` of a command that writes a directory of evidence (soak, bench, bringup)."""
    return typer.Option(
        "--report",
        help=f"Report directory (default: {_report_default(default)}; docs/cli.md, report directories): {contents}.",
    )
