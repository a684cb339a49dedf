"""One place per concept (issue 48): one clock type, and no module ``__getattr__`` that keeps moved names alive."""

from __future__ import annotations

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
