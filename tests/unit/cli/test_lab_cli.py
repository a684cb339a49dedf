"""``calctl lab run``'s refusals before it talks to a lab: exit 2, naming the option and what was expected."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import Cli, assert_no_traceback


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tags", "board=calculet", "--", "serve"], "command 'serve': expected one of bringup"),
        (["--tags", "board=calculet"], "command '(none)'"),
        (["--tags", "board=calculet", "--", "bringup", "--report", "x"], "--report is set by the lab"),
        (["--tags", "Board=x", "--", "device", "check"], "'Board=x' is not KEY=VALUE"),
        (["--tags", "board", "--", "device", "check"], "'board' is not KEY=VALUE"),
        (["--", "device", "check"], "--tags: expected at least one KEY=VALUE"),
        (["--tags", "board=c", "--count", "0", "--", "device", "check"], "--count"),
        (["--tags", "board=c", "--timeout", "inf", "--", "device", "check"], "--timeout"),
    ],
)
def test_lab_run_refuses_bad_input_with_exit_2(cli: Cli, args: list[str], said: str) -> None:
    result = cli("lab", "run", *args)
    assert result.code == 2, result.err
    assert said in result.err
    assert_no_traceback(result)


def test_without_labgrid_lab_run_names_the_extra(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "labgrid", None)  # import labgrid raises ImportError
    result = cli("lab", "run", "--tags", "board=calculet", "--", "device", "check")
    assert result.code == 2
    assert "calctl lab needs labgrid" in result.err and "calctl[lab]" in result.err
    assert_no_traceback(result)


def test_the_core_imports_no_labgrid() -> None:
    """calctl.lab's package, its board runner and the fleet run's planning import without labgrid."""
    import subprocess

    code = (
        "import sys; sys.modules['labgrid'] = None\n"
        "import calctl.cli.app, calctl.lab, calctl.lab.board, calctl.lab.places, calctl.cli.lab_cmds\n"
        "assert not [m for m in sys.modules if m.startswith('labgrid.')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
