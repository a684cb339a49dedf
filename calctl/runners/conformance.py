"""``calctl device conformance`` as a report: the suite's rows and the graded vendor questions of one library.

:func:`run_conformance` loads the library through calctl's own loader (its ABI gate first: a library that loads but
fails the gate is the ``abi_version`` check's FAIL row and no other check runs; one that does not load at all is
the loader's :class:`~calctl.runtime.errors.LibraryError`, exit 3), runs :func:`calctl.runtime.conformance.run_suite`
on the package (the bundled combined sample by default) and makes the one :class:`~calctl.report.Report` both the
command and ``bringup``/``accept``'s ``conformance`` step show (:mod:`calctl.runners.board_steps`).

This module runs and reports; it renders nothing (the CLI does).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calctl.report import Report, build_header

GRADE_NOTE = (
    "grades describe the library {library} as measured here (001 §1: C0 measured, C1 symbol present but behaviour "
    "not shown, C3 not measurable through ABI 1.x: ask the vendor, C4 refused); they are evidence about a Calculet "
    "board only when that library drives one"
)


def run_conformance(
    library_path: Path,
    *,
    package: Path | None = None,
    level: str = "standard",
    checks: Sequence[str] | None = None,
    check_timeout: float = 60.0,
    on_result: Callable[[Any], None] | None = None,
) -> Report:
    """The suite on ``library_path`` at ``level`` (``checks``: only these; the caller has checked the names)."""
    from calctl.compiler.bundled import bundled_package
    from calctl.package.reader import package_root
    from calctl.runtime import DeviceKind
    from calctl.runtime._native.lib import load_library
    from calctl.runtime.conformance import (
        ConformanceLevel,
        ConformanceSuiteResult,
        ConformanceTarget,
        run_suite,
        vendor_questions,
    )
    from calctl.runtime.errors import LibraryError

    def progress(row: Any) -> None:
        if on_result is not None:
            on_result(row)

    try:
        library: Any = load_library(library_path)
    except LibraryError as exc:
        if not _dlopens(library_path):
            raise  # exit 3: no such file, or not a loadable library (the path named)
        library, refused = None, exc  # it loads but fails calctl's ABI gate: that is abi_version's FAIL row
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(package_root(package)) if package is not None else bundled_package("combined")
        target = ConformanceTarget(
            DeviceKind.CALRT, Path(root).resolve(), Path(library_path).resolve(), ConformanceLevel(level)
        )
        if library is None:
            suite = ConformanceSuiteResult(target, tuple(_abi_gate_rows(target, refused, progress)))
        else:
            suite = run_suite(target, checks, check_timeout=check_timeout, on_result=progress)
    results = list(suite.results)
    answers = vendor_questions(results)
    abi = f"{library.abi[0]}.{library.abi[1]}" if library is not None else None
    header = build_header("device conformance", device="calrt", versions=_versions_seen(results, abi))
    note = GRADE_NOTE.format(library=library_path)
    if library is None:
        note = f"{refused.message}: calctl refuses this library, so no other check ran. " + note
    if header.get("note"):  # a software model says so first, as every result on it does (docs/runtime.md §7)
        note = f"{header['note']}. {note}"
    evidence = results[0].evidence if library is None and results else {}
    return Report(
        "device conformance",
        "PASS" if suite.passed else "FAIL",
        header,
        {
            "library": str(library_path),
            "abi": abi or evidence.get("abi", "unknown"),
            "extensions": sorted(library.extensions) if library is not None else [],
            "package": str(package) if package is not None else "bundled combined sample",
            "level": level,
            "counts": suite.counts(),
            "checks": [r.to_dict() for r in results],
            "vendor_questions": [a.to_dict() for a in answers],
            "note": note,
        },
    )


def failing_rows(doc: dict[str, Any]) -> list[str]:
    """Each check that did not pass as ``name (clauses): detail`` (``name (clauses) TIMEOUT: detail`` for one that
    did not end), in the suite's order."""
    rows = []
    for c in doc.get("checks") or []:
        if isinstance(c, dict) and c.get("verdict") in ("FAIL", "TIMEOUT"):
            clauses = ", ".join(c.get("clauses") or [])
            said = " TIMEOUT" if c["verdict"] == "TIMEOUT" else ""
            rows.append(f"{c['name']}{f' ({clauses})' if clauses else ''}{said}: {c.get('detail') or ''}")
    return rows


def _versions_seen(results: list[Any], abi: str | None) -> dict[str, Any] | None:
    """The runtime versions the versions_topology check read (with whether the shim says it is a software
    model), for the report header's device label; None when that check did not pass."""
    row = next((r for r in results if r.name == "versions_topology" and r.verdict.value == "PASS"), None)
    if row is None:
        return None
    keys = ("runtime", "driver", "firmware", "software_model")
    return {**{k: row.evidence.get(k) for k in keys}, "abi": abi}


def _dlopens(path: Path) -> bool:
    """The file is a library this process can load (what calctl's loader does first, before its ABI gate)."""
    try:
        ctypes.CDLL(str(Path(path).resolve()))
    except OSError:
        return False
    return Path(path).is_file()


def _abi_gate_rows(target: Any, refused: Exception, progress: Callable[[Any], None]) -> list[Any]:
    """The abi_version check, in this process (it dlopens the library and calls calrt_abi_version, as calctl's
    loader just did); it must FAIL where the loader refused, else the refusal stands (exit 3)."""
    from calctl.runtime.conformance import CHECKS, Verdict, run_check

    row = run_check(next(c for c in CHECKS if c.name == "abi_version"), target)
    if row.verdict is not Verdict.FAIL:
        raise refused
    progress(row)
    return [row]
