"""The folder tree reads top-down: no folder of calctl imports a folder above it.

Layers, lowest first. A module may import its own folder and any folder in a
lower layer; folders in one layer do not import each other. Imports inside
functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import calctl

ROOT = Path(calctl.__file__).parent

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "filekind"}),
    frozenset({"records", "textsafe", "cache", "closing", "limits", "jsonsafe", "__init__"}),
    frozenset({"report"}),
    frozenset({"html_report"}),  # reads the verdict table of report (#48 item 2)
    frozenset({"signing"}),
    frozenset({"package"}),
    frozenset({"budget", "model"}),
    frozenset({"compiler"}),
    frozenset({"runtime"}),
    frozenset({"checks"}),
    frozenset({"serving"}),
    frozenset({"loadgen"}),  # the load generator (a library): bench's HTTP client, datasets, arrivals, statistics
    frozenset({"runners", "fleet"}),  # fleet: several boards' runs as child processes, and their reports
    frozenset({"lab"}),  # labgrid places of boards on many hosts (the optional lab extra), merged by fleet
    frozenset({"cli"}),
    frozenset({"__main__"}),
)

#: Edges a rework removes; each must disappear, never grow.
PENDING: frozenset[tuple[str, str]] = frozenset()


def _layer(top: str) -> int:
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"calctl/{top} is in no layer of {__name__}.LAYERS: add it")


def _top(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if (
                parts[0] == "calctl"
                and len(parts) > 1
                and ((ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").exists())
            ):
                out.add(parts[1])
    return out


def test_no_folder_imports_a_folder_above_it() -> None:
    bad: list[str] = []
    seen: set[tuple[str, str]] = set()
    for path in sorted(ROOT.rglob("*.py")):
        src = _top(path)
        for dst in _imports(path):
            if dst == src:
                continue
            if _layer(dst) >= _layer(src):
                seen.add((src, dst))
                if (src, dst) not in PENDING:
                    bad.append(
                        f"{path.relative_to(ROOT.parent)} imports calctl.{dst} (layer {_layer(dst)} >= {_layer(src)})"
                    )
    assert not bad, "\n".join(bad)
    stale = PENDING - seen
    assert not stale, f"remove {sorted(stale)} from PENDING: those imports are gone"


def test_every_npy_read_goes_through_the_thread_safe_loader() -> None:
    """``np.load`` parses headers with ``ast.literal_eval``, which two threads can break on CPython 3.11
    (calctl/package/npy.py): only that module calls it."""
    calls = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "package" / "npy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("np", "numpy")
            ):
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == [], f"np.load outside calctl/package/npy.py: {calls}"


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def test_serving_core_imports_no_engine_api_or_runtime() -> None:
    """serving/core is the scheduling logic alone (000 §4–§9): it imports nothing from the engine that drives it,
    the HTTP API, or a runtime; the engine adapts the core to the device, never the other way round."""
    bad = []
    for path in _sources("serving/core"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for m in mods:
                if m.startswith(("calctl.serving.engine", "calctl.serving.api", "calctl.runtime")):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {m}")
    assert not bad, "\n".join(bad)


def test_runners_and_serving_reach_no_backend_by_its_class_or_private_attributes() -> None:
    """What only a simulated board can do goes through ``calctl.runtime.FaultInjecting`` (an isinstance check on
    the protocol); a submit count through ``Runtime.on_submit``: no ``MockRuntime`` check, no ``getattr(rt, ...)``
    and no ``._rt`` in runners/ or serving/."""
    bad = []
    for path in _sources("runners", "serving"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Name) and node.id == "MockRuntime":
                bad.append(f"{where}: MockRuntime")
            elif isinstance(node, ast.Attribute) and node.attr == "_rt":
                bad.append(f"{where}: ._rt")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and isinstance(node.args[0], ast.Name | ast.Attribute)
                and (node.args[0].id if isinstance(node.args[0], ast.Name) else node.args[0].attr) in ("rt", "_rt")
            ):
                bad.append(f"{where}: {node.func.id}(rt, ...)")
    assert not bad, "\n".join(bad)


def test_the_cache_directory_is_named_in_one_place() -> None:
    """``$CALCTL_CACHE_DIR`` / ``$XDG_CACHE_HOME`` are read by ``calctl/cache.py`` alone (in the lowest layer, so the
    runtime, the model kernels and the bundled samples share one rule instead of importing upward or copying it)."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "cache.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in ("CALCTL_CACHE_DIR", "XDG_CACHE_HOME"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} reads ${node.value}")
    assert not bad, "use calctl.cache.cache_dir():\n" + "\n".join(bad)


def test_serving_imports_nothing_from_runners_and_carries_no_fault_injector() -> None:
    """serving/ is the product; fault injection belongs to the mock (fault plans) or to a runner's test wrapper
    (``calctl.runners.soak.inject``): no serving module imports runners/, and none is an injector."""
    bad = [str(p.relative_to(ROOT.parent)) for p in _sources("serving") if "runners" in _imports(p)]
    assert not bad, bad
    injectors = [str(p.relative_to(ROOT.parent)) for p in _sources("serving") if "inject" in p.stem]
    assert not injectors, injectors
    from calctl.runners.soak.inject import StaleRedelivery

    assert StaleRedelivery.__module__ == "calctl.runners.soak.inject"
