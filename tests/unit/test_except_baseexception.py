"""``except BaseException`` only where a run ends: the run driver and the CLI's entry (#48 acceptance).

Anywhere else, clean-up that must run on an interrupt is ``try``/``finally``, a context manager or an
``contextlib.ExitStack``; catching BaseException there would turn Ctrl-C or SIGTERM into an ordinary failure.
A bare ``except:`` is the same catch and counts too, as does a tuple naming BaseException.
"""

from __future__ import annotations

import ast
from pathlib import Path

import calctl

ROOT = Path(calctl.__file__).parent

#: Where a run ends: the one run driver, and the CLI's entry that turns every error into an exit code.
ALLOWED = frozenset({"calctl/runners/driver.py", "calctl/cli/app.py", "calctl/__main__.py"})


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
    """``file:line`` of every handler in *source* that catches BaseException (bare ``except:`` included)."""
    tree = ast.parse(source, filename=filename)
    return [
        f"{filename}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ExceptHandler) and _catches_base_exception(node)
    ]


def test_the_finder_sees_every_spelling() -> None:
    src = (
        "try:\n    pass\nexcept BaseException:\n    pass\n"
        "try:\n    pass\nexcept:\n    pass\n"
        "try:\n    pass\nexcept (OSError, builtins.BaseException) as e:\n    pass\n"
        "try:\n    pass\nexcept Exception:\n    pass\n"
    )
    assert base_exception_handlers(src, "m.py") == ["m.py:3", "m.py:7", "m.py:11"]


def test_base_exception_is_caught_only_by_the_run_driver_and_the_cli_entry() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        name = path.relative_to(ROOT.parent).as_posix()
        if name not in ALLOWED:
            offenders += base_exception_handlers(path.read_text(encoding="utf-8"), name)
    assert not offenders, "except BaseException outside the run driver and the CLI's entry:\n" + "\n".join(offenders)
