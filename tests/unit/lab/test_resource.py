"""calctl.lab.resource: the CalculetBoard as labgrid builds it from an exporter's parameters."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from calctl.errors import UsageError

labgrid = pytest.importorskip("labgrid", reason="labgrid is not installed (pip install 'calctl[lab]')")


def test_a_calculet_board_from_an_exporters_parameters() -> None:
    from labgrid import Target

    from calctl.lab.resource import CalculetBoard, command_prefix

    target = Target("t")
    make: Any = CalculetBoard  # attrs over labgrid's untyped Resource: target and name come first
    board = make(target, "rack1-b0", board_id="rack1-b0", mock_seed=3, fault_plan="/p.yaml")
    lab_board = board.lab_board()
    assert (lab_board.board_id, lab_board.mock_seed, lab_board.fault_plan) == ("rack1-b0", 3, "/p.yaml")
    assert lab_board.environment() == {"CALCTL_BOARD_ID": "rack1-b0", "CALCTL_MOCK_SEED": "3"}
    assert command_prefix(lab_board) == []  # no host: the client runs it
    here = make(target, "b1", board_id="b1", host=socket.gethostname())
    assert command_prefix(here.lab_board()) == []  # this machine by name: no SSH to itself
    bad = make(target, "b2", board_id="b2", device="calrt", mock_seed=1)
    with pytest.raises(UsageError, match="for the mock device, not calrt"):
        bad.lab_board()


def test_a_host_that_cannot_be_reached_is_the_runs_infrastructure_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labgrid import Target
    from labgrid.driver.exception import ExecutionError

    import calctl.lab.driver as driver_module
    from calctl.lab.driver import CalctlDriver
    from calctl.lab.resource import CalculetBoard

    def refuse(board: object, extra: object = None) -> list[str]:
        raise ExecutionError("failed to connect to rack9-host")

    monkeypatch.setattr(driver_module, "command_prefix", refuse)
    target = Target("t")
    make: Any = CalculetBoard  # attrs over labgrid's untyped classes: target and name come first
    make(target, "b9", board_id="b9", host="rack9-host")
    maker: Any = CalctlDriver
    driver = maker(target, None, out_dir=str(tmp_path))
    target.activate(driver)
    run = driver.run("device", "check")
    assert run.verdict is None and run.infra_error is not None
    assert "cannot reach the host over SSH" in run.infra_error and "rack9-host" in run.infra_error
    assert (run.out_dir / "board.json").is_file() and (run.out_dir / "lab-run.json").is_file()
