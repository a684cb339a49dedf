"""One place per concept (issue 48): one clock type, and no module ``__getattr__`` that keeps moved names alive."""

from __future__ import annotations

import ast
import re
from pathlib import Path

CALCTL = Path(__file__).resolve().parents[2] / "calctl"


def _lines(pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [
        f"{p.relative_to(CALCTL)}:{n}"
        for p in sorted(CALCTL.rglob("*.py"))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if rx.match(line)
    ]


def test_the_engine_has_one_clock_type() -> None:
    (only,) = _lines(r"Clock\s*=")
    assert only.startswith("serving/engine/options.py:"), only


def test_no_module_keeps_moved_names_through_getattr() -> None:
    """A module-level ``__getattr__`` re-exporting names that moved hides the real import path from readers and
    from mypy; importers name the module the code lives in."""
    assert _lines(r"def __getattr__\(") == []


#: Modules whose ``__all__`` still names what another calctl module defines, each with why it may. The runner
#: modules are being reshaped into the run driver (issue 48 item 1); their re-exports go with that work.
REEXPORTS_ALLOWED = {
    "runners/acceptance/plan.py": "runner package, issue 48 item 1",
    "runners/acceptance/run.py": "runner package, issue 48 item 1",
    "runners/context.py": "runner package, issue 48 item 1",
    "runners/golden.py": "runner package, issue 48 item 1",
    "runners/soak/run.py": "runner package, issue 48 item 1",
    "runners/steps.py": "runner package, issue 48 item 1",
    "runners/traffic.py": "runner package, issue 48 item 1",
    "runners/warmup.py": "runner package, issue 48 item 1",
}


def _reexports(path: Path) -> list[str]:
    """The names ``path``'s ``__all__`` lists that it imports from another calctl module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("calctl")
        for alias in node.names
    }
    listed = [
        elt.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        for elt in getattr(node.value, "elts", [])
        if isinstance(elt, ast.Constant)
    ]
    return [name for name in listed if name in imported]


def test_a_module_exports_only_what_it_defines() -> None:
    """A package's ``__init__`` is its public face and may gather names; any other module that lists a name it
    imports keeps an old import path alive (``calctl.model.tiny`` for the decoder, ``serving.api.app`` for
    ``ApiSettings``): importers name the module the code lives in."""
    found = {
        str(p.relative_to(CALCTL)): names
        for p in sorted(CALCTL.rglob("*.py"))
        if p.name != "__init__.py" and (names := _reexports(p))
    }
    assert {k: v for k, v in found.items() if k not in REEXPORTS_ALLOWED} == {}


def test_the_reexport_scan_sees_a_reexport(tmp_path: Path) -> None:
    shim = tmp_path / "shim.py"
    shim.write_text('from calctl.model.decoder import prefill\n\n__all__ = ["prefill", "own"]\n', encoding="utf-8")
    assert _reexports(shim) == ["prefill"]
