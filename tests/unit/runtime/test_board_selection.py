"""Which board a process owns: ``select_board`` from the environment, and ``calctl device info`` showing it (issue 11)."""

from __future__ import annotations

import pytest

from calctl.errors import UsageError
from calctl.runtime import DeviceKind, open_runtime, select_board
from calctl.runtime.mock import MockRuntime
from tests.conftest import Cli


def test_mock_defaults_to_mock0_and_leaves_the_fault_plan_seed_alone() -> None:
    sel = select_board("mock", {})
    assert (sel.board, sel.source, sel.seed, sel.confirmed) == ("mock0", "default", 0, True)
    assert sel.mock_options() == {}  # a --fault-plan's own seed still applies


def test_mock_board_and_seed_from_the_environment() -> None:
    sel = select_board("mock", {"CALCTL_BOARD_ID": "rack1-b3", "CALCTL_MOCK_SEED": "11"})
    assert (sel.board, sel.source, sel.seed) == ("rack1-b3", "CALCTL_BOARD_ID", 11)
    assert sel.mock_options() == {"seed": 11}
    with open_runtime("mock", **sel.mock_options()) as rt:
        assert isinstance(rt, MockRuntime)
        assert rt.config.seed == 11


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"CALCTL_MOCK_SEED": "-1"}, "CALCTL_MOCK_SEED"),
        ({"CALCTL_MOCK_SEED": "seven"}, "CALCTL_MOCK_SEED"),
        ({"CALCTL_BOARD_ID": "board 1"}, "CALCTL_BOARD_ID"),
        ({"CALCTL_BOARD_ID": 'b"}'}, "CALCTL_BOARD_ID"),
        ({"CALCTL_BOARD_ID": "x" * 65}, "CALCTL_BOARD_ID"),
    ],
)
def test_malformed_values_are_usage_errors(env: dict[str, str], needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        select_board("mock", env)


def test_calrt_selection_is_requested_never_confirmed() -> None:
    sel = select_board(DeviceKind.CALRT, {"CALRT_DEVICE": "0000:01:00.0"})
    assert (sel.board, sel.source, sel.selector, sel.confirmed) == (
        "0000:01:00.0",
        "CALRT_DEVICE",
        "0000:01:00.0",
        False,
    )
    assert "cannot report which board" in sel.describe()["note"]
    named = select_board("calrt", {"CALRT_DEVICE": "0000:02:00.0", "CALCTL_BOARD_ID": "rack1-b4"})
    assert (named.board, named.selector) == ("rack1-b4", "0000:02:00.0")
    unset = select_board("calrt", {})
    assert (unset.board, unset.selector, unset.source) == ("default", None, "default")


def test_calrt_selector_that_cannot_be_a_label_needs_a_board_id() -> None:
    with pytest.raises(UsageError, match="CALRT_DEVICE") as info:
        select_board("calrt", {"CALRT_DEVICE": "pci 01:00.0"})
    assert "CALCTL_BOARD_ID" in (info.value.hint or "")
    assert select_board("calrt", {"CALRT_DEVICE": "pci 01:00.0", "CALCTL_BOARD_ID": "b1"}).selector == "pci 01:00.0"


def test_device_info_shows_the_board(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_BOARD_ID", "board-7")
    monkeypatch.setenv("CALCTL_MOCK_SEED", "5")
    r = cli("device", "info", "--format", "json")
    assert r.code == 0, r.err
    assert r.json["board"] == {
        "id": "board-7",
        "source": "CALCTL_BOARD_ID",
        "confirmed": True,
        "seed": 5,
        "seed_source": "CALCTL_MOCK_SEED",
    }
    r = cli("device", "info")
    assert r.code == 0 and "board board-7 (from CALCTL_BOARD_ID), fault seed 5" in r.out


def test_device_info_calrt_says_not_confirmed(cli: Cli, calrt_stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALRT_DEVICE", "0000:01:00.0")
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub, "--format", "json")
    assert r.code == 0, r.err
    board = r.json["board"]
    assert (board["id"], board["selector"], board["confirmed"]) == ("0000:01:00.0", "0000:01:00.0", False)
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub)
    assert r.code == 0 and "not confirmed" in r.out


def test_device_info_bad_seed_is_exit_2(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_MOCK_SEED", "x")
    r = cli("device", "info")
    assert r.code == 2 and "CALCTL_MOCK_SEED" in r.err and "Traceback" not in r.err
