"""The serving stack's own layers (issue 27 item 4; docs/serving-core.md, calctl/serving/__init__.py).

* ``serving/core`` is pure scheduling logic: it imports nothing from ``serving.engine``, ``serving.api``,
  ``calctl.runtime`` or the protocol, and no asyncio, threading or FastAPI (time is an argument);
* ``serving/api`` knows the engine only through ``serving.protocol.EngineClient``: no ``serving.engine``,
  no ``serving.core``, no runtime;
* nothing in ``serving`` imports the CLI or the runners above it (tests/unit/test_layers.py checks folders).

Imports inside functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import calctl.serving

SERVING = Path(calctl.serving.__file__).parent

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": (
        "calctl.serving.engine",
        "calctl.serving.api",
        "calctl.serving.protocol",
        "calctl.runtime",
        "asyncio",
        "threading",
        "fastapi",
    ),
    "api": ("calctl.serving.engine", "calctl.serving.core", "calctl.runtime"),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _hits(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_serving_subpackage_imports_nothing_above_it(package: str) -> None:
    files = sorted((SERVING / package).rglob("*.py"))
    assert files, f"calctl/serving/{package} has no modules"
    bad = [
        f"{p.relative_to(SERVING.parent.parent)} imports {name}"
        for p in files
        for name in sorted(_imports(p))
        if _hits(name, FORBIDDEN[package])
    ]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from calctl.serving.engine.loop import EngineCore\n", encoding="utf-8")
    assert any(_hits(n, FORBIDDEN["core"]) for n in _imports(module))
