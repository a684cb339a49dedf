"""Issue 27's size limits for the serving stack: no module over 800 lines, ``EngineCore`` under 500.

A module that grows past them holds several things: move one out (``engine/packages.py``,
``engine/admit.py`` and ``engine/output.py`` came out of the supervisor and the core that way).
"""

from __future__ import annotations

import ast
from pathlib import Path

import calctl.serving

SERVING = Path(calctl.serving.__file__).parent
MODULE_LINES = 800
ENGINE_CORE_LINES = 500


def test_no_serving_module_is_over_800_lines() -> None:
    sizes = {p.relative_to(SERVING).as_posix(): len(p.read_text().splitlines()) for p in SERVING.rglob("*.py")}
    assert "engine/supervisor.py" in sizes, "the walk must see the serving tree"
    over = {name: n for name, n in sizes.items() if n > MODULE_LINES}
    assert not over, f"modules over {MODULE_LINES} lines: {over}"


def test_engine_core_is_under_500_lines() -> None:
    tree = ast.parse((SERVING / "engine" / "loop.py").read_text())
    (core,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineCore"]
    assert core.end_lineno is not None
    lines = core.end_lineno - core.lineno + 1
    assert lines < ENGINE_CORE_LINES, f"EngineCore is {lines} lines; move what it holds into its collaborators"
