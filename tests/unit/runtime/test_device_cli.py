"""``calctl device info`` on the mock and on the CalRT stub; exit 3 for a missing library."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import Cli, assert_no_traceback


def test_device_info_mock_json(cli: Cli) -> None:
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


def test_device_info_mock_table(cli: Cli) -> None:
    r = cli("device", "info")
    assert r.code == 0, r.err
    assert "device mock" in r.out and "mock results" in r.out and "health" in r.out


def test_device_info_calrt_stub(cli: Cli, calrt_stub: Path) -> None:
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub, "--format", "json")
    assert r.code == 0, r.err
    doc = r.json
    assert doc["device"] == "calrt" and doc["simulated"] is False and doc["note"] is None
    assert doc["library"] == str(calrt_stub) and doc["versions"]["firmware"] == "stub"


def test_device_info_fails_memory_figures_that_cannot_be_bytes(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """#50 item 3: a shim reporting calrt_memory_usage in KiB: the totals disagree with the topology's DRAM, a
    FAIL naming the call (exit 1); the unmodified reference board is PASS (exit 0)."""
    from calctl.runtime._native.build import build_reference

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH")
    for define, code in (("-DCALRT_MUTANT_MEMORY_KIB", 1), (None, 0)):
        lib = build_reference(tmp_path_factory.mktemp("kib"), defines=(define,) if define else ()).library
        r = cli("device", "info", "--device", "calrt", "--calrt-lib", lib, "--format", "json")
        assert r.code == code, (define, r.out, r.err)
        findings = r.json["memory_findings"]
        assert bool(findings) == bool(define) and r.json["verdict"] == ("FAIL" if define else "PASS"), findings
        if define:
            assert "calrt_memory_usage reports 16777216 B in total, the topology 17179869184 B" in findings[0]
            r = cli("device", "info", "--device", "calrt", "--calrt-lib", lib)
            assert r.code == 1 and "FAIL chip 0: calrt_memory_usage" in r.out, r.out


def test_device_info_calrt_without_library_is_exit_3(cli: Cli, tmp_path: Path) -> None:
    r = cli("device", "info", "--device", "calrt")
    assert r.code == 3
    assert "no CalRT library" in r.err and "CALRT_LIBRARY" in r.err
    assert_no_traceback(r)
    missing = tmp_path / "libcalrt.so"
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", missing)
    assert r.code == 3 and str(missing) in r.err
    assert_no_traceback(r)


def test_device_info_names_the_missing_symbol(cli: Cli, calrt_stub_without_kv_free: Path) -> None:
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub_without_kv_free)
    assert r.code == 3 and "calrt_kv_free" in r.err and str(calrt_stub_without_kv_free) in r.err.replace("\n", "")
    assert_no_traceback(r)


# -- device build-reference ------------------------------------------------------------------


def test_build_reference_prints_the_library_last_and_reuses_an_identical_build(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "board"
    r = cli("device", "build-reference", "--out", out)
    assert r.code == 0, r.err
    lib = Path(r.out.strip().splitlines()[-1])
    assert lib == out / "libcalrt_reference.so" and lib.is_file() and "built" in r.out
    r = cli("device", "build-reference", "--out", out)
    assert r.code == 0 and Path(r.out.strip().splitlines()[-1]) == lib and "reused" in r.out
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", lib, "--format", "json")
    assert r.code == 0 and r.json["versions"]["firmware"] == "reference (software model, no hardware)"


def test_build_reference_defaults_to_the_cache_dir(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("device", "build-reference")
    assert r.code == 0, r.err
    lib = Path(r.out.strip().splitlines()[-1])
    assert lib.is_file() and lib.parent.parent == tmp_path / "cache" / "calrt-reference"


def test_build_reference_without_a_compiler_is_exit_2(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    r = cli("device", "build-reference", "--out", tmp_path / "x")
    assert r.code == 2 and "no-such-cc" in r.err and "CC=" in r.err
    assert_no_traceback(r)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("CC")
    r = cli("device", "build-reference", "--out", blocker)
    assert r.code == 2 and str(blocker) in r.err.replace("\n", "")
    assert_no_traceback(r)


# -- device conformance ----------------------------------------------------------------------


def test_conformance_on_the_stub_fails_golden_only(cli: Cli, calrt_stub: Path) -> None:
    r = cli("device", "conformance", "--calrt-lib", calrt_stub, "--format", "json", "--level", "quick")
    assert r.code == 1, r.err
    doc = r.json
    assert doc["device"] == "calrt" and doc["library"] == str(calrt_stub) and doc["verdict"] == "FAIL"
    assert doc["level"] == "quick"
    failed = [c for c in doc["checks"] if c["verdict"] not in ("PASS", "UNSUPPORTED")]
    # The stub's outputs are not the model's: every check that compares outputs fails (the bundled sample
    # compiles B1 and B4, so the batch lanes and the long run's twins too; a decode against a prefill of the same
    # tokens), and so does the one that needs tokens checked (it computes nothing); nothing else does.
    names = ["token_refusals", "golden_compute", "batch_lanes", "long_run", "kv_positions"]
    assert [c["name"] for c in failed] == names
    golden = failed[1]
    assert golden["clauses"] == ["COMPUTE-1", "COMPUTE-2"]  # the ABI clause the check tries (docs/calrt-c-abi.md §13)
    # the stub exports no calrt_chip_telemetry (docs/calrt-c-abi.md §15): C4, never a pass
    unsupported = [c["name"] for c in doc["checks"] if c["verdict"] == "UNSUPPORTED"]
    assert unsupported == [
        "telemetry_struct",
        "telemetry_under_load",
        "telemetry_across_resets",
        "telemetry_attribution",
    ]
    assert "graph 'model_a_prefill'" in golden["detail"] and golden["call"] and golden["returned"]
    assert {q["grade"] for q in doc["vendor_questions"]} <= {"C0", "C1", "C3", "C4"} and "as measured here" in doc[
        "note"
    ]
    assert all(q["ask"] for q in doc["vendor_questions"] if q["grade"] == "C3")


def test_conformance_on_the_reference_board_passes_table_and_junit(cli: Cli, calrt_reference: Path) -> None:
    import xml.etree.ElementTree as ET

    r = cli(
        "device", "conformance", "--calrt-lib", calrt_reference, "--check", "golden_compute", "--check", "kv_lifecycle"
    )
    assert r.code == 0, r.out + r.err
    assert "golden_compute" in r.out and "vendor questions" in r.out and "verdict PASS" in r.out
    r = cli("device", "conformance", "--calrt-lib", calrt_reference, "--check", "memory_counters", "--format", "junit")
    assert r.code == 0, r.err
    root = ET.fromstring(r.out)
    assert (
        root.get("tests") == "1"
        and root.get("failures") == "0"
        and [t.get("name") for t in root.iter("testcase")] == ["memory_counters"]
    )


def test_conformance_usage_and_library_errors(
    cli: Cli, tmp_path: Path, calrt_stub_without_kv_free: Path, calrt_stub: Path
) -> None:
    r = cli("device", "conformance")
    assert r.code == 2 and "--calrt-lib" in r.err
    r = cli("device", "conformance", "--calrt-lib", calrt_stub, "--check", "no_such_check")
    assert r.code == 2 and "no_such_check" in r.err and "golden_compute" in r.err
    # A library that loads but misses a symbol: abi_version's FAIL row naming it (exit 1), no other check.
    r = cli("device", "conformance", "--calrt-lib", calrt_stub_without_kv_free, "--format", "json")
    assert r.code == 1, (r.out, r.err)
    [row] = r.json["checks"]
    assert row["name"] == "abi_version" and row["verdict"] == "FAIL" and row["call"] == "dlsym", row
    assert "calrt_kv_free" in row["returned"] and "missing symbol calrt_kv_free" in r.json["note"]
    r = cli("device", "conformance", "--calrt-lib", calrt_stub, "--package", tmp_path / "nope")
    assert r.code == 2 and "nope" in r.err
    for res in (r,):
        assert_no_traceback(res)


def test_conformance_on_a_hanging_library_reports_timeout_rows(
    cli: Cli, calrt_stub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALRT_STUB_FAULTS", "delay_ms=5000")
    args = ("device", "conformance", "--calrt-lib", calrt_stub, "--check-timeout", "1", "--format", "json")
    r = cli(*args, "--check", "job_states_timestamps", "--check", "status_strings")
    assert r.code == 1, r.err
    rows = {c["name"]: c["verdict"] for c in r.json["checks"]}
    assert rows == {"status_strings": "PASS", "job_states_timestamps": "TIMEOUT"}
    assert r.json["counts"]["TIMEOUT"] == 1 and r.json["verdict"] == "FAIL"


def test_conformance_junit_survives_control_characters_from_a_shim() -> None:
    import xml.etree.ElementTree as ET

    from calctl.cli.device_native_cmds import conformance_junit

    row = {"name": "status_strings", "verdict": "FAIL", "seconds": 0.1, "detail": "string 'bad\x01\x1b'"}
    doc: dict[str, object] = {"library": "lib\x00.so", "abi": "1.0", "package": "p", "vendor_questions": []}
    doc["checks"] = [{**row, "call": "calrt_status_string", "arguments": "7", "returned": "\x07"}]
    root = ET.fromstring(conformance_junit(doc))
    assert root.get("failures") == "1" and ["bad" in (f.get("message") or "") for f in root.iter("failure")] == [True]


def test_conformance_on_the_reference_board_is_labelled_a_software_model(cli: Cli, calrt_reference: Path) -> None:
    """Issue 28: the reference board says it is a software model (calrt_ext_device_identity); the conformance
    report says so first, in its note, its device label and its table footer."""
    args = ("device", "conformance", "--calrt-lib", calrt_reference, "--check", "versions_topology")
    r = cli(*args, "--format", "json")
    assert r.code == 0, (r.out, r.err)
    assert r.json["device_label"] == "software model" and r.json["runtime"]["software_model"] is True
    assert r.json["note"].startswith("SOFTWARE MODEL RESULT") and r.json["mock_result"] is False
    r = cli(*args)
    assert r.code == 0 and "SOFTWARE MODEL RESULT" in r.out.replace("\n", " "), r.out
