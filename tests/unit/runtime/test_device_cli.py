"""``calctl device info`` on the mock and on the CalRT stub; exit 3 for a missing library."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import assert_no_traceback


def test_device_info_mock_json(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("device", "info", "--format", "json")
    assert r.code == 0, r.err
    doc = r.json
    assert doc["device"] == "mock" and doc["simulated"] is True and "mock results" in doc["note"]
    assert doc["topology"] == {"chips": 2, "calcores_per_chip": 2}
    assert [c["chip"] for c in doc["chips"]] == [0, 1]
    chip = doc["chips"][0]
    assert chip["dram_bytes"] == 16 << 30 and chip["memory_used_bytes"] > 0
    assert (chip["pending"], chip["finished"], chip["failed"], chip["health"]) == (0, 0, 0, "ok")
    assert doc["versions"]["runtime"] == "0.7.6"


def test_device_info_mock_table(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("device", "info")
    assert r.code == 0, r.err
    assert "device mock" in r.out and "mock results" in r.out and "health" in r.out


def test_device_info_calrt_stub(cli, calrt_stub: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub, "--format", "json")
    assert r.code == 0, r.err
    doc = r.json
    assert doc["device"] == "calrt" and doc["simulated"] is False and doc["note"] is None
    assert doc["library"] == str(calrt_stub) and doc["versions"]["firmware"] == "stub"


def test_device_info_calrt_without_library_is_exit_3(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("device", "info", "--device", "calrt")
    assert r.code == 3
    assert "no CalRT library" in r.err and "CALRT_LIBRARY" in r.err
    assert_no_traceback(r)
    missing = tmp_path / "libcalrt.so"
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", missing)
    assert r.code == 3 and str(missing) in r.err
    assert_no_traceback(r)


def test_device_info_names_the_missing_symbol(cli, calrt_stub_without_kv_free: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub_without_kv_free)
    assert r.code == 3 and "calrt_kv_free" in r.err and str(calrt_stub_without_kv_free) in r.err.replace("\n", "")
    assert_no_traceback(r)
