"""A command's ``--help`` renders from its signature alone: no library behind the command is imported (issue 31).

Speed itself is measured in ``benchmarks/bench_help.py``; here the cause of a slow help is held off: the set of
modules that ``calctl <command> --help`` leaves in ``sys.modules``, for every command and group of the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

from calctl.cli.app import root_command

#: Libraries and calctl layers that no help page needs (each was imported by some --help before issue 31).
HEAVY_LIBRARIES = (
    "numpy",
    "matplotlib",
    "jsonschema",
    "cryptography",
    "yaml",
    "elftools",
    "jinja2",
    "pydantic",
    "fastapi",
    "starlette",
    "uvicorn",
    "tokenizers",
)
HEAVY_CALCTL = (
    "calctl.budget",
    "calctl.checks",
    "calctl.compiler",
    "calctl.loadgen",
    "calctl.model",
    "calctl.package",
    "calctl.runners",
    "calctl.runtime",
    "calctl.serving",
    "calctl.signing",
)


def _command_paths(group, path=()):
    """Every command and group of the CLI, as argument lists: ("device",), ("device", "info"), ..."""
    ctx = typer.Context(group, info_name="calctl")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield (*path, name)
        if hasattr(cmd, "list_commands"):
            yield from _command_paths(cmd, (*path, name))


COMMAND_PATHS = list(_command_paths(root_command()))

# One child process runs every help page in turn and reports, for each, the modules it added: sys.modules only
# grows, so a heavy module shows under the first help page that imported it.
_PROBE = """
import contextlib, io, json, sys
from calctl.cli import main
paths = json.loads(sys.argv[1])
before = set(sys.modules)
added = {}
for path in paths:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*path, "--help"])
    now = set(sys.modules)
    added[" ".join(path)] = {"code": code, "usage": "Usage: calctl" in out.getvalue(), "modules": sorted(now - before)}
    before = now
print(json.dumps(added))
"""


@pytest.fixture(scope="module")
def added_by_help() -> dict[str, dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(COMMAND_PATHS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    result: dict[str, dict[str, object]] = json.loads(out.stdout.splitlines()[-1])
    return result


def _heavy(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.split(".")[0] in HEAVY_LIBRARIES or any(m == c or m.startswith(c + ".") for c in HEAVY_CALCTL)
    ]


def test_the_cli_has_every_command_and_group() -> None:
    names = {" ".join(p) for p in COMMAND_PATHS}
    assert {"validate", "budget", "bringup", "accept", "device", "device info", "poc combined", "import hf"} <= names
    assert len(names) >= 25


@pytest.mark.parametrize("path", [" ".join(p) for p in COMMAND_PATHS])
def test_help_imports_no_library_behind_the_command(added_by_help, path: str) -> None:
    page = added_by_help[path]
    assert page["code"] == 0 and page["usage"], page
    assert _heavy(page["modules"]) == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The check above can fail: a command that runs (not its help) shows the libraries it imports."""
    assert _heavy(["numpy", "numpy.core", "calctl.budget.plan", "calctl.cli.budget_cmds", "rich.table"]) == [
        "numpy",
        "numpy.core",
        "calctl.budget.plan",
    ]


def test_the_cli_uses_no_private_typer_or_click_internals() -> None:
    """Only Typer's public API (issue 48): a private module or a swapped ``sys.modules`` entry breaks on any
    Typer release. Typer's help renderer imports rich.markdown and rich.traceback; that cost is accepted
    (benchmarks/bench_help.py measures it)."""
    import pathlib
    import re

    cli = pathlib.Path(__file__).resolve().parents[3] / "calctl" / "cli"
    private = re.compile(
        r"typer\._\w+|typer\.rich_utils|rich\._\w+|(import|from) click\b|sys\.modules\s*(\[|\.update|\.pop)"
    )
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(cli.glob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if private.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == [], found


def test_option_values_spelled_in_the_cli_equal_the_librarys() -> None:
    """Bounds, defaults and choices the help shows are written out in the CLI; they must equal the library's."""
    from calctl.budget import plan, units
    from calctl.cli import budget_cmds, import_cmds
    from calctl.cli._options import RunLevel
    from calctl.compiler.importer import build
    from calctl.runners import bringup
    from calctl.runners.acceptance import run as acceptance

    assert budget_cmds.MAX_CONTEXT == plan.MAX_CONTEXT
    assert budget_cmds.MAX_SEQUENCES == plan.MAX_SEQUENCES
    assert budget_cmds.OPTION_DTYPES == units.OPTION_DTYPES
    assert import_cmds.DEFAULT_SEQUENCES == build.DEFAULT_SEQUENCES
    assert import_cmds.KEEP_BLOCKS == build.KEEP_BLOCKS
    assert ",".join(map(str, build.DEFAULT_PROFILES)) == import_cmds.DEFAULT_PROFILES
    assert [v.value for v in RunLevel] == [v.value for v in bringup.Level] == [v.value for v in acceptance.Level]
