"""No function in calctl/ is longer than a reader can hold (#48 acceptance: 120 lines).

Complexity (McCabe 15) is ruff's C901 gate in pyproject.toml; length is checked here, over every ``def`` and
``async def`` (methods and nested functions included), from its ``def`` line to its last line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import calctl

ROOT = Path(calctl.__file__).parent
MAX_FUNCTION_LINES = 120


def long_functions(source: str, filename: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:line name (N lines)`` for every function of *source* longer than *limit* lines."""
    out = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                out.append(f"{filename}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_the_length_check_counts_from_def_to_last_line() -> None:
    def method(lines: int) -> str:
        return "class C:\n    async def f(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(lines - 1))

    assert long_functions(method(121), "m.py") == ["m.py:2 f (121 lines)"]
    assert long_functions(method(120), "m.py") == []


def test_no_function_in_calctl_is_over_120_lines() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT.parent)))
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(found)
