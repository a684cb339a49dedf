"""The test tree keeps one import style, so ``python -m pytest`` works from any folder of the checkout.

Every folder of Python tests is a package (has ``__init__.py``), and a helper module of the tests is imported
by its full name (``from tests.unit.runtime.runtime_helpers import package``), never by its bare name
(``from runtime_helpers import package``), which only resolves when pytest happens to put that folder on
``sys.path`` first.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

TESTS = REPO / "tests"
NOT_PYTHON_PACKAGES = ("assets", "native")  # data and C sources


def _python_files() -> list[Path]:
    return [
        p
        for p in sorted(TESTS.rglob("*.py"))
        if not any(part in NOT_PYTHON_PACKAGES for part in p.relative_to(TESTS).parts[:1])
        and "__pycache__" not in p.parts
    ]


def test_every_test_folder_is_a_package() -> None:
    folders = {p.parent for p in _python_files()}
    missing = sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"test folders without __init__.py: {missing}"


def test_test_helpers_are_imported_by_their_full_name() -> None:
    files = _python_files()
    helper_names = {p.stem for p in files if p.stem not in ("__init__", "conftest")}
    bare: list[str] = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.split(".")[0] in helper_names:
                    bare.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}: relative import")
    assert not bare, "import test helpers as tests.<folder>.<module>:\n" + "\n".join(bare)


def test_unit_tests_import_no_integration_harness() -> None:
    """A unit test runs one component in-process; a test that needs an integration harness (a real engine, a
    server, a subprocess) lives in tests/integration/ (docs/testing.md)."""
    bad: list[str] = []
    for path in _python_files():
        if path.relative_to(TESTS).parts[0] not in ("unit", "stateful"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.integration"):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module}")
            if isinstance(node, ast.Import):
                bad += [
                    f"{path.relative_to(REPO)}:{node.lineno}: {a.name}"
                    for a in node.names
                    if a.name.startswith("tests.integration")
                ]
    assert not bad, "\n".join(bad)


def _calls_time_sleep(loop: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "sleep"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "time"
        for n in ast.walk(loop)
    )


def _is_async_deadline_loop(loop: ast.AST) -> bool:
    """A ``while`` that awaits ``asyncio.sleep`` and reads a clock: a deadline loop written by hand."""
    attrs = [
        (n.func.attr, n.func.value.id if isinstance(n.func.value, ast.Name) else "")
        for n in ast.walk(loop)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    ]
    sleeps = ("sleep", "asyncio") in attrs
    return isinstance(loop, ast.While) and sleeps and any(attr in ("time", "monotonic") for attr, _ in attrs)


def test_every_wait_goes_through_wait_until() -> None:
    """No hand-written polling loop (a ``while`` or ``for`` that calls ``time.sleep``): a test waits with
    ``tests.waiting.wait_until``, whose deadline fails naming what it waited for (docs/testing.md)."""
    bad: list[str] = []
    for path in _python_files():
        if path == TESTS / "waiting.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.While, ast.For)) and (_calls_time_sleep(node) or _is_async_deadline_loop(node)):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, "poll with tests.waiting.wait_until:\n" + "\n".join(bad)
