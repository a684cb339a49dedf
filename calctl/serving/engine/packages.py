"""Which package the DeviceSupervisor may load, and from where (000 §11 step 1; 001 §10.4).

Pure decisions on paths and manifests: resolving a package directory or archive
into a :class:`LoadedPackage`, admitting the path an admin request names, and
checking that another package serves what the running engine cores were built
for. No lifecycle and no device here (:mod:`calctl.serving.engine.supervisor`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from calctl.errors import ConfigError
from calctl.package import archive
from calctl.package.info import package_digest
from calctl.package.model import Model
from calctl.package.reader import load_manifest
from calctl.serving.engine.options import LoadedPackage


def resolve_package(source: Path) -> LoadedPackage:
    """Step 1: a trusted, stable directory for the package (a tar is extracted safely and kept)."""
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"{source}: no such package")
    if source.is_dir():
        root = source.resolve()
        return LoadedPackage(source, root, load_manifest(root), package_digest(root))
    tmp = Path(tempfile.mkdtemp(prefix="calctl-serve-"))
    with contextlib.ExitStack() as failing:  # a refused or interrupted extraction leaves no directory behind
        failing.callback(shutil.rmtree, tmp, ignore_errors=True)
        root = archive.extract_package(source, tmp)
        loaded = LoadedPackage(source, root, load_manifest(root), package_digest(root), tmp)
        failing.pop_all()
    return loaded


def admin_package_path(package: str, served: Iterable[Path | None], roots: tuple[Path, ...]) -> Path:
    """000 §11 step 1 for an admin load that names a package: an absolute path under one of ``roots`` (after
    resolving symlinks and ``..``), or one of the packages this server ``served``. Anything else is refused
    with :class:`ConfigError`, before the path is read."""
    if not package or "\x00" in package:
        raise ConfigError("package: expected the absolute path of a package directory or archive")
    p = Path(package)
    if not p.is_absolute():
        raise ConfigError(
            f"package {package!r}: give an absolute path (a relative one would name the server's working directory)"
        )
    resolved = p.resolve()
    if any(x is not None and Path(x).resolve() == resolved for x in served):
        return resolved
    if any(resolved.is_relative_to(root) for root in roots):
        return resolved
    allowed = ", ".join(str(r) for r in roots) or "none: start serve with --package-root DIR"
    raise ConfigError(f"package {package}: not under an allowed package root ({allowed})")


def check_compatible(lp: LoadedPackage, served: Mapping[str, Model]) -> None:
    """The engine cores were built for the start-up package's models (``served``, by alias): another package
    must serve the same aliases with the same graphs, tokenizer and architecture (else restart ``calctl serve``)."""
    if not served:
        return
    aliases = {m.alias for m in lp.package.models}
    if aliases != set(served):
        raise ConfigError(
            f"{lp.source}: serves {', '.join(sorted(aliases))}, this server {', '.join(sorted(served))}; "
            "restart `calctl serve` to change the models"
        )
    for alias, old in served.items():
        new = lp.package.model(alias)
        for what, a, b in (
            ("prefill graph", new.prefill.name, old.prefill.name),
            ("decode graph", new.decode.name, old.decode.name),
            ("architecture", new.architecture, old.architecture),
            ("tokenizer", new.tokenizer, old.tokenizer),
        ):
            if a != b:
                raise ConfigError(
                    f"{lp.source}: model {alias!r} has another {what} than the one served; "
                    "restart `calctl serve` to change the models"
                )


__all__ = ["admin_package_path", "check_compatible", "resolve_package"]
