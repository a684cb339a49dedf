"""``--fault-plan`` names a regular file: a FIFO or a device is refused at once, naming what it is, by every
command that takes it, ``serve`` included (it hung on a FIFO, waiting for a writer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from calctl.errors import ConfigError
from calctl.runtime.mock.faults import FaultPlan
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "plan.yaml"
    os.mkfifo(p)
    return p


def test_serve_refuses_a_fifo_as_its_fault_plan_without_waiting(fifo: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "calctl", "serve", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB),
         "--fault-plan", str(fifo), "--port", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"--fault-plan {fifo}: is a FIFO, not a regular file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", [["run-golden"], ["poc", "combined"]])
def test_runners_name_what_the_fault_plan_is(cli: Cli, fifo: Path, command: list[str]) -> None:
    r = cli(*command, FIXTURE_PACKAGES / "combined", "--trusted-key", TEST_PUB, "--fault-plan", fifo)
    assert_no_traceback(r)
    assert r.code == 2 and "is a FIFO, not a regular file" in r.err, r.err
    r = cli(*command, FIXTURE_PACKAGES / "combined", "--trusted-key", TEST_PUB, "--fault-plan", fifo.with_name("no"))
    assert r.code == 2 and "no such file" in r.err, r.err


def test_the_mock_never_blocks_on_a_fifo_plan(fifo: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        FaultPlan.load(fifo)
