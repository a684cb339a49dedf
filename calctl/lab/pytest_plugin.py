"""pytest fixtures for a lab's CI over labgrid's plugin (``--lg-env``): ``def test_bringup(calctl_board): ...``.

Load it from the lab's ``conftest.py`` (``pytest_plugins = ["calctl.lab.pytest_plugin"]``) and run pytest with
``--lg-env env.yaml`` whose ``main`` target has the board (a ``RemotePlace`` of a locked place, or a local
``CalculetBoard``) and ``imports: [calctl.lab.driver]``. ``calctl_board`` is the target's
:class:`~calctl.lab.driver.CalctlDriver`, activated; each ``calctl_board.run(...)`` leaves its report
directory, JUnit and log under ``--calctl-lab-reports`` (default: pytest's temporary directory).

It imports labgrid (the ``lab`` extra); calctl's own test suite does not load it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calctl.lab.driver import CalctlDriver


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("calctl").addoption(
        "--calctl-lab-reports",
        dest="calctl_lab_reports",
        default=None,
        help="directory for each calctl_board run's report directory, JUnit and log (default: pytest's tmp)",
    )


@pytest.fixture(scope="session")
def calctl_board(
    request: pytest.FixtureRequest, target: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CalctlDriver]:
    """The ``main`` target's CalctlDriver, active: ``calctl_board.run("bringup", "--level", "quick")``."""
    from labgrid.exceptions import NoDriverFoundError

    base = request.config.getoption("calctl_lab_reports")
    out = Path(base) if base else tmp_path_factory.mktemp("calctl-lab")
    try:
        driver = target.get_driver(CalctlDriver, activate=False)
    except NoDriverFoundError:
        make: Any = CalctlDriver  # attrs over labgrid's untyped Driver: its __init__ is labgrid's
        driver = make(target, None, out_dir=str(out))
    if driver.out_dir is None:
        driver._base = out
    target.activate(driver)
    yield driver
    target.deactivate(driver)


__all__ = ["calctl_board", "pytest_addoption"]
