"""No two runner packages or modules import each other, directly or through others (#48 acceptance).

The nodes are the entries directly below ``calctl/runners`` (a package such as ``soak`` or ``bench`` stands for
everything below it; a module such as ``bringup.py`` for itself). Every import counts: inside functions, under
``if TYPE_CHECKING:`` and relative ones, because each is a dependency a reader has to hold in mind.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import calctl

RUNNERS = Path(calctl.__file__).parent / "runners"


def _node(path: Path) -> str | None:
    """The runner package or module a file belongs to (None for ``runners/__init__.py`` itself)."""
    rel = path.relative_to(RUNNERS)
    if rel.parts == ("__init__.py",):
        return None
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The dotted module an ``ImportFrom`` names, a relative one resolved against the file's package."""
    if node.level == 0:
        return node.module or ""
    package = list(path.relative_to(RUNNERS.parent.parent).with_suffix("").parts)[:-1]  # the file's package
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(path: Path, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(runner node, line) for every import in the file that reaches into calctl.runners.<node>."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] != ["calctl", "runners"] or len(parts) < 3:
                continue
            if (RUNNERS / parts[2]).is_dir() or (RUNNERS / f"{parts[2]}.py").exists():
                yield parts[2], node.lineno


def runner_import_graph(root: Path = RUNNERS) -> dict[str, dict[str, str]]:
    """node -> {imported node: the first ``file:line`` that imports it}."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(root.rglob("*.py")):
        src = _node(path)
        if src is None:
            continue
        graph.setdefault(src, {})
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for dst, line in _targets(path, tree):
            if dst != src:
                graph[src].setdefault(dst, f"{path.relative_to(root.parent.parent)}:{line}")
    return graph


def import_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def test_the_cycle_finder_sees_a_circle_through_three_nodes() -> None:
    graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:1"}, "c": {"a": "c.py:1"}, "d": {"a": "d.py:1"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b": "a.py:1"}, "b": {}}) == []


def test_relative_imports_resolve_to_their_runner_package() -> None:
    tree = ast.parse("from ..bench import run\nfrom . import plan\nfrom ...report import Report\n")
    assert set(_targets(RUNNERS / "soak" / "x.py", tree)) == {("bench", 1), ("soak", 2)}


def test_no_two_runner_packages_import_each_other() -> None:
    graph = runner_import_graph()
    cycles = import_cycles(graph)
    lines = []
    for group in cycles:
        members = set(group)
        edges = [f"{a} -> {b} ({where})" for a in group for b, where in sorted(graph[a].items()) if b in members]
        lines.append(" / ".join(group) + ": " + "; ".join(edges))
    assert not cycles, "runner packages that import each other:\n" + "\n".join(lines)
