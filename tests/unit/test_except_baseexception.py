"""``except BaseException`` only where a run ends: the run driver and the CLI's entry (#48 acceptance).

Anywhere else, clean-up that must run on an interrupt is ``try``/``finally``, a context manager or an
``contextlib.ExitStack``; catching BaseException there would turn Ctrl-C or SIGTERM into an ordinary failure.
A bare ``except:`` is the same catch and counts too, as does a tuple naming BaseException.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import calctl

ROOT = Path(calctl.__file__).parent

#: Where a run ends: the one run driver, and the CLI's entry that turns every error into an exit code.
ALLOWED = frozenset({"calctl/runners/driver.py", "calctl/cli/app.py", "calctl/__main__.py"})

#: The top of a thread that must hand whatever ended it (an interrupt included) to the thread that joins it, as
#: ``file::function`` with the reason. Each entry is reviewed: anything else is clean-up and has another form.
THREAD_TOPS: dict[str, str] = {
    # An inbox command runs on the engine loop's thread for a caller waiting on its future: like the standard
    # library's thread-pool work item, it must hand every exception (a signal's Interrupted included) to that
    # future, or the loop thread dies with the command unanswered and the caller runs it a second time.
    "calctl/serving/engine/inbox.py::run": "a command hands every exception to its caller's future",
}


def _catches_base_exception(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        (isinstance(k, ast.Name) and k.id == "BaseException")
        or (isinstance(k, ast.Attribute) and k.attr == "BaseException")
        for k in kinds
    )


def base_exception_handlers(source: str, filename: str) -> list[str]:
    """``file:line (function)`` of every handler in *source* that catches BaseException (bare ``except:`` included),
    leaving out those in the functions :data:`THREAD_TOPS` names."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        listed = f"{filename}::{function}" in THREAD_TOPS
        if isinstance(node, ast.ExceptHandler) and _catches_base_exception(node) and not listed:
            found.append(f"{filename}:{node.lineno} ({function or 'module level'})")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source, filename=filename), "")
    return found


def test_the_finder_sees_every_spelling() -> None:
    src = (
        "try:\n    pass\nexcept BaseException:\n    pass\n"
        "try:\n    pass\nexcept:\n    pass\n"
        "try:\n    pass\nexcept (OSError, builtins.BaseException) as e:\n    pass\n"
        "try:\n    pass\nexcept Exception:\n    pass\n"
    )
    assert base_exception_handlers(src, "m.py") == [
        "m.py:3 (module level)",
        "m.py:7 (module level)",
        "m.py:11 (module level)",
    ]


def test_a_listed_thread_top_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    src = "def one():\n    try:\n        pass\n    except BaseException as exc:\n        errors.append(exc)\n"
    assert base_exception_handlers(src, "m.py") == ["m.py:4 (one)"]
    monkeypatch.setitem(THREAD_TOPS, "m.py::one", "re-raised in the joining thread")
    assert base_exception_handlers(src, "m.py") == []


def test_base_exception_is_caught_only_by_the_run_driver_and_the_cli_entry() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        name = path.relative_to(ROOT.parent).as_posix()
        if name not in ALLOWED:
            offenders += base_exception_handlers(path.read_text(encoding="utf-8"), name)
    assert not offenders, "except BaseException outside the run driver and the CLI's entry:\n" + "\n".join(offenders)
