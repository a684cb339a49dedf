"""Resolving the PKG argument: a path, or the bundled sample when omitted.

The sample compiler (numpy) and the signing library are imported only when a
command resolves its package, never by ``calctl --help``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from calctl.cli import _output
from calctl.errors import UsageError

if TYPE_CHECKING:
    from calctl.signing.policy import TrustPolicy

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
    from calctl.signing.policy import make_policy

    if pkg is None:
        from calctl.compiler.bundled import bundled_package

        path = bundled_package("combined")
        _output.info(f"[dim]using the bundled combined sample package: {path}[/]")
        return path, make_policy(trusted, allow_unsigned, trust_test_key=True), True
    if not os.path.lexists(pkg):  # before any step runs: bring-up reported a missing package as a device ERROR
        raise UsageError(f"{pkg}: no such file or directory", hint="give a package directory or .tar")
    return pkg, make_policy(trusted, allow_unsigned), False
