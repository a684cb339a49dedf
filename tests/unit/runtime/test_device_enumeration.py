"""The optional enumeration calls (calrt_ext_device_count/calrt_ext_device_name, docs/calrt-c-abi.md §11) on the
bookkeeping stub: ``device list`` lists its boards, and ``--boards all`` runs one process per board with its
CALRT_DEVICE (docs/boards.md)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from calctl.runtime._native.lib import enumerate_devices, load_library
from tests.conftest import Cli, assert_no_traceback
from tests.unit.runtime.conftest import _compile


def test_the_stub_lists_its_default_board_or_the_names_it_is_given(
    calrt_stub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CALRT_STUB_BOARDS", raising=False)
    monkeypatch.delenv("CALRT_STUB_PCI", raising=False)
    lib = load_library(calrt_stub)
    assert enumerate_devices(lib) == ["stub0"]
    monkeypatch.setenv("CALRT_STUB_BOARDS", "0000:01:00.0,,0000:02:00.0")
    assert enumerate_devices(lib) == ["0000:01:00.0", "0000:02:00.0"]
    # an index past the count and a buffer too small are refused, never written past
    buf = ctypes.create_string_buffer(64)
    assert lib.fn.calrt_ext_device_name(2, buf, 64) != 0 and buf.raw == b"\0" * 64
    assert lib.fn.calrt_ext_device_name(0, buf, 4) != 0 and buf.raw == b"\0" * 64


def test_a_library_without_the_calls_lists_nothing(calrt_stub: Path) -> None:
    lib = load_library(calrt_stub)
    bare = type(lib)(lib.path, lib.fn, lib.abi, lib.extensions - {"calrt_ext_device_count"})
    assert enumerate_devices(bare) is None


def test_boards_all_runs_one_process_per_enumerated_board(
    cli: Cli, calrt_stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALRT_STUB_BOARDS", "0000:01:00.0,0000:02:00.0")
    monkeypatch.delenv("CALCTL_BOARDS", raising=False)
    r = cli("device", "list", "--device", "calrt", "--calrt-lib", calrt_stub, "--format", "json")
    assert r.code == 0 and [b["device"] for b in r.json["boards"]] == ["0000:01:00.0", "0000:02:00.0"]
    assert "enumeration" in r.json["source"]
    out = tmp_path / "fleet"
    r = cli("device", "check", "--boards", "all", "--device", "calrt", "--calrt-lib", calrt_stub, "--report", out,
            "--format", "json")  # fmt: skip
    assert_no_traceback(r)
    rows = {b["board_id"]: b for b in r.json["boards"]}
    assert set(rows) == {"0000:01:00.0", "0000:02:00.0"}
    for board_id, row in rows.items():
        # the stub's outputs are a hash of its inputs: each board ran, and failed its known answers (not infrastructure)
        assert row["verdict"] == "FAIL" and not row["infrastructure"] and row["selector"] == board_id
        assert row["library"] == str(calrt_stub)
    assert r.code == 1


def _conformance(cli: Cli, library: Path) -> dict:
    r = cli("device", "conformance", "--calrt-lib", library, "--check", "enumeration", "--format", "json")
    assert_no_traceback(r)
    row = next(c for c in r.json["checks"] if c["name"] == "enumeration")
    return {"code": r.code, **row}


def test_conformance_checks_the_enumeration_and_fails_a_shim_that_writes_past_a_short_buffer(
    cli: Cli, calrt_stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALRT_STUB_BOARDS", "0000:01:00.0,0000:02:00.0")
    good = _conformance(cli, calrt_stub)
    assert good["verdict"] == "PASS" and good["code"] == 0 and "0000:02:00.0" in good["detail"], good
    broken = _compile(tmp_path, "libcalrt_enum_overflow.so", "-DCALRT_STUB_ENUM_OVERFLOW")
    bad = _conformance(cli, broken)
    assert bad["verdict"] == "FAIL" and bad["code"] == 1 and "writes nothing" in bad["detail"], bad
    assert "ENUM-1" in bad["clauses"]
