"""Clean-up that runs on every way out, Ctrl-C and SIGTERM included, without catching BaseException (#48).

Each place below used ``except BaseException: undo; raise``; it now registers its undo on an ExitStack. These tests
interrupt each one (KeyboardInterrupt, what SIGINT and calctl's SIGTERM handler raise) and check the undo ran and
the interrupt went on; a rule or parser crash (a pyo3 panic included) is still a finding, an interrupt never.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from calctl.package import validate as validate_mod
from calctl.package.rules.base import Status
from calctl.package.rules.context import crash_types
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS, SIGNATURE
from calctl.signing.keys import load_private
from tests.conftest import TEST_KEY


def _interrupt_signature_write(monkeypatch: pytest.MonkeyPatch) -> None:
    real = seal._atomic_write

    def write(path: Path, data: bytes) -> None:
        if path.name == SIGNATURE:
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(seal, "_atomic_write", write)


@pytest.mark.parametrize("had_checksums", [True, False])
def test_an_interrupted_seal_puts_the_old_checksums_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, had_checksums: bool
) -> None:
    (tmp_path / "a.txt").write_bytes(b"a\n")
    old = b"0" * 64 + b"  a.txt\n"
    if had_checksums:
        (tmp_path / CHECKSUMS).write_bytes(old)
    _interrupt_signature_write(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        seal.seal(tmp_path, load_private(TEST_KEY))
    if had_checksums:
        assert (tmp_path / CHECKSUMS).read_bytes() == old
    else:
        assert not (tmp_path / CHECKSUMS).exists()
    assert not (tmp_path / SIGNATURE).exists()


def test_an_interrupted_hash_map_stops_the_other_workers_and_goes_on() -> None:
    stops: list[threading.Event] = []

    def fn(item: str, stop: threading.Event) -> str:
        stops.append(stop)
        if item == "b":
            raise KeyboardInterrupt
        return item

    with pytest.raises(KeyboardInterrupt):
        seal.stoppable_map(fn, ["a", "b", "c"], jobs=1)
    assert stops and stops[0].is_set()
    assert seal.stoppable_map(fn, ["a", "c"], jobs=2) == ["a", "c"]


def _rule(error: BaseException) -> Any:
    def check(ctx: Any) -> Any:
        raise error
        yield

    return SimpleNamespace(needs=frozenset(), check=check)


def test_a_rule_crash_is_a_finding_a_pyo3_panic_included() -> None:
    panic = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})
    assert panic in crash_types()
    ctx = SimpleNamespace(unmet=lambda needs: None)
    for error in (ValueError("odd input"), panic("called `Option::unwrap()` on a `None` value")):
        (finding,) = validate_mod._findings(_rule(error), ctx)  # type: ignore[arg-type]
        assert finding.status is Status.ERROR
        assert f"the rule crashed and could not decide: {type(error).__name__}" in finding.message


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), SystemExit(143), GeneratorExit()])
def test_an_interrupt_inside_a_rule_is_never_a_finding(interrupt: BaseException) -> None:
    ctx = SimpleNamespace(unmet=lambda needs: None)
    with pytest.raises(type(interrupt)):
        validate_mod._findings(_rule(interrupt), ctx)  # type: ignore[arg-type]


def test_a_mock_board_whose_setup_was_interrupted_can_be_opened_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from calctl.runtime.mock.board import MockRuntime

    real = MockRuntime._setup

    def interrupted(self: MockRuntime) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(MockRuntime, "_setup", interrupted)
    with pytest.raises(KeyboardInterrupt):
        MockRuntime()
    monkeypatch.setattr(MockRuntime, "_setup", real)
    MockRuntime().close()
