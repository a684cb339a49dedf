"""Shared ``Annotated`` options, so every command spells them the same way."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from calctl.cli._output import Format


class DeviceKind(str, enum.Enum):
    mock = "mock"
    calrt = "calrt"


FormatOpt = Annotated[
    Format,
    typer.Option("--format", "-f", help="Output format: table for people, json (stdout) for machines."),
]
TableJsonFormatOpt = FormatOpt

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
        help="Ed25519 public key (PEM) trusted to sign packages; repeatable. A directory of keys comes from CALCTL_TRUSTED_KEYS.",
    ),
]
AllowUnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned", help="Accept an unsigned or untrusted package, reported as a warning (never silently)."
    ),
]
