"""One word, one meaning: no class name is defined twice in calctl, and no two modules share a report-ish name.

A class name found in two modules makes every ``from ... import X`` a question of which ``X``; a reader of
``report.py`` should not have to ask which report. Classes nested in a function or another class are not
counted (they are not importable by name).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import calctl

ROOT = Path(calctl.__file__).parent

#: Basenames that must name one module of calctl only: each of these says "the" report, records or server.
UNIQUE_BASENAMES = ("report.py", "records.py", "server.py")


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _top_level_classes(body: list[ast.stmt]) -> Iterator[str]:
    """Classes a module defines at its top level, including inside top-level ``if``/``try`` blocks."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.If):
            yield from _top_level_classes(node.body)
            yield from _top_level_classes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level_classes(block)


def _class_modules() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name in _top_level_classes(tree.body):
            out[name].add(path.relative_to(ROOT).as_posix())
    return out


def test_no_class_name_is_defined_in_two_modules() -> None:
    found = _class_modules()
    assert len(found) > 100, "the walk found almost no classes: is ROOT calctl's package directory?"
    twice = {name: sorted(mods) for name, mods in found.items() if len(mods) > 1}
    assert not twice, f"class names defined in more than one module (rename one side): {twice}"


def test_no_class_name_is_defined_twice_in_one_module() -> None:
    twice: list[str] = []
    for path in _modules():
        names = list(_top_level_classes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body))
        twice += [f"{path.relative_to(ROOT).as_posix()}: {n}" for n in sorted(set(names)) if names.count(n) > 1]
    assert not twice, f"a class defined twice in one module (the second hides the first): {twice}"


def test_report_records_and_server_each_name_one_module() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if path.name in UNIQUE_BASENAMES:
            by_name[path.name].append(rel)
    shared = {name: mods for name, mods in by_name.items() if len(mods) > 1}
    assert not shared, f"modules sharing a name that must be unique (name them after what they hold): {shared}"
