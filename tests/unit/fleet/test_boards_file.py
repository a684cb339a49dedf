"""The boards of a host: the boards file (bounded YAML, every bad entry named), --boards selection, each board's
environment and options, and the child's argv (calctl.fleet.boards, calctl.cli._boards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calctl.cli._boards import child_args
from calctl.errors import UsageError
from calctl.fleet.boards import Board, host_boards, load_boards_file, select


def _file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "slow.yaml").write_text("schema: calctl-fault-plan/v1\nfaults: []\n")
    path = tmp_path / "boards.yaml"
    path.write_text(text)
    return path


def test_a_boards_file_lists_mock_and_calrt_boards(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "boards:\n"
        "  - {id: rack1-b0, kind: mock, seed: 3}\n"
        "  - {id: rack1-b1, kind: mock, seed: 4, fault_plan: slow.yaml, place: host-7}\n"
        "  - {id: card-0, kind: calrt, device: '0000:01:00.0', library: slow.yaml}\n",
    )
    boards = load_boards_file(path)
    assert [b.id for b in boards] == ["rack1-b0", "rack1-b1", "card-0"]
    assert boards[1].fault_plan == (tmp_path / "slow.yaml").absolute() and boards[1].place == "host-7"
    assert boards[2].device == "0000:01:00.0" and boards[2].source == "boards file"


@pytest.mark.parametrize(
    ("entry", "names"),
    [
        ("{id: 'bad id', kind: mock}", ["boards[0].id", "'bad id'"]),
        ("{id: b0, kind: fpga}", ["boards[0].kind", "'fpga'", "mock or calrt"]),
        ("{id: b0, kind: mock, seed: -1}", ["boards[0].seed", "-1", "non-negative"]),
        ("{id: b0, kind: mock, seed: 'x'}", ["boards[0].seed", "'x'"]),
        ("{id: b0, kind: mock, device: '0000:01:00.0'}", ["boards[0].device", "calrt only"]),
        ("{id: b0, kind: calrt, seed: 1}", ["boards[0].seed", "mock only"]),
        ("{id: b0, kind: mock, fault_plan: missing.yaml}", ["boards[0].fault_plan", "missing.yaml", "no such file"]),
        ("{id: b0, kind: mock, colour: red}", ["boards[0]", "unknown field", "colour"]),
        ("{id: b0}\n  - {id: b0}", ["boards[1].id", "'b0'", "boards[0]"]),
        ("{id: a, kind: calrt}\n  - {id: b, kind: calrt}", ["two calrt boards", "'default'"]),
        ("just-a-string", ["boards[0]", "expected a mapping"]),
    ],
)
def test_a_bad_entry_is_refused_naming_the_file_the_field_and_the_value(
    tmp_path: Path, entry: str, names: list[str]
) -> None:
    path = _file(tmp_path, f"boards:\n  - {entry}\n")
    with pytest.raises(UsageError) as err:
        load_boards_file(path)
    assert err.value.exit_code == 2
    for name in [str(path), *names]:
        assert name in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("boards: []\n", "lists no board"),
        ("- {id: b0}\n", "a 'boards' list"),
        ("boards:\n  - &a {id: b0}\n  - *a\n", "boards file"),  # the bounded loader refuses aliases
        ("boards: [{id: b0}]\nextra: 1\n", "unknown top-level key"),
    ],
)
def test_a_bad_file_is_a_usage_error(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        load_boards_file(_file(tmp_path, text))


def test_a_missing_file_and_a_directory_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        load_boards_file(tmp_path / "nope.yaml")
    with pytest.raises(UsageError):
        load_boards_file(tmp_path)


def test_the_boards_env_names_the_file_and_without_one_the_environment_has_one_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CALCTL_BOARDS", raising=False)
    monkeypatch.setenv("CALCTL_BOARD_ID", "bench-3")
    monkeypatch.setenv("CALCTL_MOCK_SEED", "9")
    boards, source = host_boards(None)
    assert [(b.id, b.seed) for b in boards] == [("bench-3", 9)] and "environment" in source
    monkeypatch.setenv("CALCTL_BOARDS", str(_file(tmp_path, "boards:\n  - {id: x1}\n  - {id: x2}\n")))
    boards, source = host_boards(None)
    assert [b.id for b in boards] == ["x1", "x2"] and "boards.yaml" in source


def test_select_all_a_list_or_refuse_an_unknown_id() -> None:
    boards = [Board("a"), Board("b"), Board("c")]
    assert select(boards, "all", "f") == boards
    assert [b.id for b in select(boards, "c,a", "f")] == ["c", "a"]
    with pytest.raises(UsageError, match="no board 'z' in f; the boards are: a, b, c"):
        select(boards, "a,z", "f")
    with pytest.raises(UsageError, match="named twice"):
        select(boards, "a,a", "f")
    with pytest.raises(UsageError, match="expected all or"):
        select(boards, " , ", "f")


def test_a_board_label_with_a_slash_never_nests_or_leaves_the_fleet_directory() -> None:
    assert Board("rack1/b3").dir_name == "rack1_b3" and Board("a/../../etc").dir_name == "a_.._.._etc"
    with pytest.raises(UsageError, match="would share the report directory 'a_b'"):
        select([Board("a/b"), Board("a_b")], "all", "f")


def test_a_boards_environment_replaces_another_boards_variables() -> None:
    base = {"PATH": "/bin", "CALCTL_BOARD_ID": "old", "CALCTL_MOCK_SEED": "1", "CALRT_DEVICE": "0000:09:00.0"}
    mock = Board("m1", "mock", seed=5, fault_plan=Path("/p.yaml"))
    assert mock.environment(base) == {"PATH": "/bin", "CALCTL_BOARD_ID": "m1", "CALCTL_MOCK_SEED": "5"}
    assert mock.options() == ["--device", "mock", "--fault-plan", "/p.yaml"]
    card = Board("c1", "calrt", device="0000:01:00.0", library=Path("/lib.so"))
    assert card.environment(base) == {"PATH": "/bin", "CALCTL_BOARD_ID": "c1", "CALRT_DEVICE": "0000:01:00.0"}
    assert card.options() == ["--device", "calrt", "--calrt-lib", "/lib.so"]


def test_the_child_runs_the_same_command_without_the_options_the_fan_out_gives_it() -> None:
    argv = [
        "device", "check", "--boards", "all", "--parallel=2", "--report", "out", "--device", "calrt",
        "--calrt-lib", "x.so", "--step-timeout", "5", "-f", "junit", "--format=table", "--boards-file", "b.yaml",
    ]  # fmt: skip
    assert child_args(argv, ["device", "check"]) == (["device", "check", "--step-timeout", "5", "--format", "json"], {})
    args, _ = child_args(["bringup", "pkg", "--level", "quick"], ["bringup"])
    assert args[:4] == ["bringup", "pkg", "--level", "quick"]
    # the level and the burn-in's minutes reach every board unchanged (the burn-in runs at --level long)
    for command in ("bringup", "accept"):
        argv = [command, "pkg", "--boards", "all", "--level=long", "--burn-in-minutes", "0.5", "--report", "r"]
        args, _ = child_args(argv, [command])
        assert args == [command, "pkg", "--level=long", "--burn-in-minutes", "0.5", "--format", "json"]
    # each board writes its own trace and plot, in its directory, never all into one file
    args, files = child_args(["run-golden", "--trace", "/tmp/t.json", "--plot=p.png", "--model", "a"], ["run-golden"])
    assert args == ["run-golden", "--model", "a", "--format", "json"]
    assert files == {"--trace": "t.json", "--plot": "p.png"}
    with pytest.raises(UsageError):
        child_args(["soak"], ["bringup"])
