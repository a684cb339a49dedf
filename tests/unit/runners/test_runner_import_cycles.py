"""No two runner packages import each other in a circle (#48): soak, bringup and acceptance formed one.

A runner unit is a direct child of ``calctl/runners`` (a package such as ``soak``, ``acceptance`` or ``bench``, or
a module such as ``bringup``). The import graph between units is read statically with :mod:`ast`, every import
counted: the module's own, those inside functions (a lazy import is still a dependency) and those under
``if TYPE_CHECKING:`` (a circle that only type-checks is still a circle a reader has to hold in mind).
"""

from __future__ import annotations

import ast
from pathlib import Path

import calctl

RUNNERS = Path(calctl.__file__).parent / "runners"


def _unit(dotted: str, root: Path) -> str | None:
    """The runner unit a dotted module name lies in (None: not under ``calctl.runners``)."""
    parts = dotted.split(".")
    if parts[:2] != ["calctl", "runners"] or len(parts) < 3:
        return None
    name = parts[2]
    return name if (root / name).is_dir() or (root / f"{name}.py").is_file() else None


def _module_parts(path: Path, root: Path) -> list[str]:
    rel = path.relative_to(root.parent.parent).with_suffix("")
    parts = list(rel.parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_units(path: Path, root: Path) -> set[str]:
    """Every runner unit ``path`` imports, anywhere in the file (module level, functions, TYPE_CHECKING)."""
    parts = _module_parts(path, root)
    package = parts if path.name == "__init__.py" else parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [module, *(f"{module}.{a.name}" for a in node.names)]
        found.update(u for u in map(lambda n: _unit(n, root), names) if u is not None)
    return found


def runner_graph(root: Path) -> dict[str, set[str]]:
    """unit -> the other units it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if len(rel.parts) == 1 and rel.name == "__init__.py":
            continue  # calctl/runners/__init__.py is the folder, no unit
        me = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        graph.setdefault(me, set()).update(imported_units(path, root) - {me})
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more units (Tarjan), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _edges_within(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    return [f"{a} -> {b}" for a in group for b in sorted(graph.get(a, ())) if b in group]


def test_no_two_runner_packages_import_each_other_in_a_circle() -> None:
    graph = runner_graph(RUNNERS)
    assert {"soak", "acceptance", "bench", "bringup"} <= set(graph)  # the walk sees the runners
    found = circles(graph)
    assert not found, "runner packages import each other in a circle: " + "; ".join(
        f"{', '.join(g)} ({', '.join(_edges_within(graph, g))})" for g in found
    )


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_the_walk_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    root = tmp_path / "calctl" / "runners"
    _write(root, "__init__.py", "")
    _write(root, "alpha/__init__.py", "from calctl.runners.alpha.plan import X\n")
    _write(
        root,
        "alpha/plan.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from calctl.runners.beta import Y\nX = 1\n",
    )
    _write(root, "beta.py", "def f():\n    from calctl.runners import gamma\n")
    _write(root, "gamma/__init__.py", "from ..alpha import plan\n")
    _write(root, "delta.py", "import calctl.runners.beta\n")
    graph = runner_graph(root)
    assert graph == {"alpha": {"beta"}, "beta": {"gamma"}, "gamma": {"alpha"}, "delta": {"beta"}}
    assert circles(graph) == [["alpha", "beta", "gamma"]]
