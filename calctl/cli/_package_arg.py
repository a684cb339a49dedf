"""Resolving the PKG argument: a path, or the bundled sample when omitted."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calctl.cli import _output
from calctl.compiler.bundled import bundled_package
from calctl.signing.policy import TrustPolicy, make_policy

PackageArg = Annotated[
    Path | None,
    typer.Argument(
        help="Package directory or .tar. Default: the bundled combined sample (mock device, test-only key)."
    ),
]


def resolve_package(
    pkg: Path | None, trusted: list[Path] | None, allow_unsigned: bool
) -> tuple[Path, TrustPolicy, bool]:
    """Return (path, trust policy, is_bundled). The bundled sample trusts its test-only key."""
    if pkg is None:
        path = bundled_package("combined")
        _output.info(f"[dim]using the bundled combined sample package: {path}[/]")
        return path, make_policy(trusted, allow_unsigned, trust_test_key=True), True
    return pkg, make_policy(trusted, allow_unsigned), False
