"""``bringup`` and ``accept`` begin with the board (issue 51 item 6): the device check at every level, the
self-test at standard and long, on the mock with its faults.

A chip that fails its known answer stops the run at the check, naming the chip, before anything about the model
runs; a stuck bit fails the self-test naming its address; without a board profile the transfer rows are NOT
JUDGED and the verdict does not turn on them. The figures are in report.json and the reason is first on the page.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from calctl.runners import bringup
from calctl.runners.acceptance import run as accept_lib
from calctl.runners.acceptance.evidence import STEPS as ACCEPT_STEPS
from calctl.runners.device import DeviceSpec
from calctl.signing.policy import TrustPolicy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback

COMBINED = FIXTURE_PACKAGES / "combined"
TRUST = ("--trusted-key", str(TEST_PUB))
WRONG_ANSWER = "{kind: corrupt_output, chip: 1, probability: 1}"
STUCK_BIT = "{kind: stuck_bit, chip: 1, address: 0x4001234, bit: 3, stuck_at: 0, probability: 1}"


def _plan(tmp_path: Path, *faults: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text("schema: calctl-fault-plan/v1\nfaults:\n" + "".join(f"  - {f}\n" for f in faults))
    return path


def _trust() -> TrustPolicy:
    from calctl.signing.policy import make_policy

    return make_policy([TEST_PUB], False)


def _page_banner(page: Path) -> str:
    """The page's first screen: the verdict banner with its reasons, as text."""
    html = page.read_text()
    banner = html[html.index('id="verdict-banner"') : html.index('id="device"')]
    return re.sub(r"<[^>]+>", " ", banner)


def _quick_on_a_wrong_board(cli: Cli, tmp_path: Path, command: str) -> tuple[Path, dict]:
    """``command`` at the quick level on a mock whose chip 1 answers wrong: exit 1, its report.json."""
    out = tmp_path / command
    r = cli(
        command, COMBINED, *TRUST, "--level", "quick", "--fault-plan", _plan(tmp_path, WRONG_ANSWER),
        "--report", out, "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, r.err[-2000:]
    return out, json.loads((out / "report.json").read_text())


def test_a_chip_with_a_wrong_known_answer_stops_bringup_at_the_check_naming_it(cli: Cli, tmp_path: Path) -> None:
    out, doc = _quick_on_a_wrong_board(cli, tmp_path, "bringup")
    assert doc["verdict"] == "FAIL"
    assert doc["error"].startswith("device-check: chip 1: wrong answer") and "model-b" in doc["error"]
    steps = {s["step"]: s for s in doc["summary"]}
    assert list(steps)[:5] == ["device-check", "conformance", "selftest", "burn-in", "validate"]
    assert steps["device-check"]["verdict"] == "FAIL" and "NOT READY: chip 1" in steps["device-check"]["key_figure"]
    for name in ("selftest", "burn-in", "validate", "budget", "run-golden", "warmup", "poc", "soak"):
        assert steps[name]["verdict"] == "SKIP", steps[name]
        assert steps[name]["detail"] == "not run: the board is not ready (device-check FAIL)"
    check = doc["step_reports"]["device-check"]  # the check's own figures, per chip
    chips = {c["chip"]: c for c in check["chips"]}
    assert chips[0]["ready"] and not chips[1]["ready"] and "wrong answer" in chips[1]["why"]
    assert (out / "device-check.json").is_file()
    banner = _page_banner(out / "report.html")
    assert "FAIL" in banner and "chip 1: wrong answer" in banner
    assert banner.index("chip 1: wrong answer") < banner.index("selftest")  # the reason first


def test_no_device_stops_bringup_at_the_check_with_exit_3(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "b"
    r = cli(
        "bringup", COMBINED, *TRUST, "--level", "quick", "--device", "calrt", "--calrt-lib", tmp_path / "absent.so",
        "--report", out, "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 3
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "ERROR" and doc["error"].startswith("device-check:") and "absent.so" in doc["error"]
    assert all(s["verdict"] == "SKIP" for s in doc["summary"][1:])


def _bringup(tmp_path: Path, steps: tuple[bringup.BringupStep, ...], plan: Path | None = None) -> dict:
    config = bringup.BringupConfig(
        package=COMBINED,
        trust=_trust(),
        device=DeviceSpec(fault_plan=plan),
        level=bringup.Level.STANDARD,
        out_dir=tmp_path / "out",
    )
    return bringup.run_bringup(config, steps=steps).document()


def test_a_stuck_bit_fails_bringup_standard_at_the_selftest_naming_its_address(tmp_path: Path) -> None:
    steps = (bringup.DEVICE_CHECK, bringup.SELFTEST_STEP, bringup.VALIDATE, bringup.BUDGET)
    doc = _bringup(tmp_path, steps, _plan(tmp_path, STUCK_BIT))
    got = {s["step"]: s for s in doc["summary"]}
    assert got["device-check"]["verdict"] == "PASS"  # the known answers are right: the board is ready
    assert got["selftest"]["verdict"] == "FAIL" and "0x4001234" in got["selftest"]["detail"]
    assert "memory chip 1" in got["selftest"]["detail"] and "memory chip 0" not in got["selftest"]["detail"]
    assert got["validate"]["verdict"] in ("PASS", "WARN") and got["budget"]["verdict"] == "GO"  # the run went on
    assert doc["verdict"] == "FAIL" and doc["exit_code"] == 1 and doc["error"].startswith("selftest: memory chip 1")
    rows = {r["name"]: r for r in doc["step_reports"]["selftest"]["rows"]}
    assert rows["memory chip 1 walking ones"]["status"] == "FAIL"
    assert rows["memory chip 0 walking ones"]["status"] == "PASS"


def test_a_healthy_board_without_a_profile_passes_with_its_transfers_not_judged(tmp_path: Path) -> None:
    doc = _bringup(tmp_path, (bringup.DEVICE_CHECK, bringup.SELFTEST_STEP))
    got = {s["step"]: s for s in doc["summary"]}
    assert got["device-check"]["verdict"] == "PASS" and "2/2 chips ready" in got["device-check"]["key_figure"]
    st = got["selftest"]
    assert st["verdict"] == "NOT JUDGED" and st["detail"].startswith("no board profile")
    assert "memory patterns 8/8 PASS" in st["key_figure"] and "GB/s on the device clock" in st["key_figure"]
    assert doc["verdict"] == "PASS" and doc["exit_code"] == 0  # NOT JUDGED does not turn the verdict
    rows = doc["step_reports"]["selftest"]["rows"]
    assert all(
        r["status"] == "NOT JUDGED" and r["figure_gbps"] is not None for r in rows if r["direction"] in ("h2d", "d2h")
    )


def test_with_a_board_profile_the_selftest_judges_its_transfers(cli: Cli, tmp_path: Path) -> None:
    profile = tmp_path / "board.yaml"
    profile.write_text(
        "schema: calculet-board-profile/v1\nboard: mock\ntransfer:\n  h2d_gbps_min: 0.01\n  d2h_gbps_min: 0.01\n"
        "  both_h2d_gbps_min: 0.01\n  both_d2h_gbps_min: 0.01\n  d2h_cv_max: 0.5\n"
    )
    config = bringup.BringupConfig(
        package=COMBINED,
        trust=_trust(),
        device=DeviceSpec(),
        level=bringup.Level.LONG,
        out_dir=tmp_path / "out",
        board_profile=profile,
    )
    doc = bringup.run_bringup(config, steps=(bringup.DEVICE_CHECK, bringup.SELFTEST_STEP)).document()
    st = {s["step"]: s for s in doc["summary"]}["selftest"]
    assert st["verdict"] == "PASS", st
    assert doc["step_reports"]["selftest"]["profile"]["path"] == str(profile)
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: calculet-board-profile/v1\ntransfer:\n  h2d_gbps_min: fast\n")
    r = cli("bringup", COMBINED, *TRUST, "--board-profile", bad, "--report", tmp_path / "r")
    assert_no_traceback(r)
    assert r.code == 2 and "bad.yaml" in r.err and "h2d_gbps_min" in r.err
    assert not (tmp_path / "r").exists()  # refused before the run


def test_accept_stops_at_a_board_that_is_not_ready_fail_naming_the_chip(cli: Cli, tmp_path: Path) -> None:
    out, doc = _quick_on_a_wrong_board(cli, tmp_path, "accept")
    assert doc["verdict"] == "FAIL" and doc["summary"].startswith("FAIL (the board is not ready: chip 1: wrong answer")
    assert doc["error"].startswith("the board is not ready: chip 1") and "model-b" in doc["error"]
    for row in doc["rows"]:
        assert row["verdict"] == "NOT MEASURED" and "the board is not ready (device-check FAIL)" in row["reason"], row
        assert "calctl device check" in row["how_to_measure"]
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["device-check"]["status"] == "FAIL"
    assert all(s["status"] == "SKIP" for n, s in steps.items() if n != "device-check")
    assert doc["board"]["device-check"]["ready"] is False and doc["board"]["selftest"] is None
    assert (out / "device-check.json").is_file()
    suite = ET.parse(out / "accept.junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"  # exit 1 is a failure in CI's view too
    failure = suite.findall("testcase")[0].find("failure")
    assert failure is not None and (failure.get("message") or "").startswith("chip 1: wrong answer")
    banner = _page_banner(out / "report.html")
    assert "chip 1: wrong answer" in banner and banner.index("chip 1: wrong answer") < banner.index("G0")
    assert doc["reasons"] == [  # one line for the eleven rows, not eleven lines
        "G0, G1, G2, G3, G4, G5, M0, M1, M2, M3, M4 NOT MEASURED: the board is not ready (device-check FAIL), so "
        "nothing after the check ran. To measure: fix the board (`calctl device check` names the chip and why), "
        "then run `calctl accept` again"
    ]


def _accept(tmp_path: Path, level: accept_lib.Level, plan: Path | None) -> dict:
    config = accept_lib.AcceptConfig(
        package=COMBINED, trust=_trust(), device=DeviceSpec(fault_plan=plan), level=level, out_dir=tmp_path / "a"
    )
    return accept_lib.run_accept(config, steps=ACCEPT_STEPS[:6]).document()  # the board steps, validate, -replica


def test_accept_standard_fails_on_a_stuck_bit_naming_the_address(tmp_path: Path) -> None:
    doc = _accept(tmp_path, accept_lib.Level.STANDARD, _plan(tmp_path, STUCK_BIT))
    assert doc["verdict"] == "FAIL" and doc["exit_code"] == 1
    assert (
        doc["summary"].startswith("FAIL (the board failed its self-test: memory chip 1")
        and "0x4001234" in doc["summary"]
    )
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["device-check"]["status"] == "PASS" and steps["selftest"]["status"] == "FAIL"
    assert steps["validate"]["status"] in ("PASS", "WARN")  # a self-test FAIL does not stop the run
    failed = [r for r in doc["board"]["selftest"]["rows"] if r["status"] == "FAIL"]
    assert failed and all("chip 1" in r["name"] and "0x4001234" in r["detail"] for r in failed)


def test_accept_quick_runs_the_check_only_and_standard_the_selftest_not_judged(tmp_path: Path) -> None:
    quick = _accept(tmp_path / "q", accept_lib.Level.QUICK, None)
    steps = {s["name"]: s for s in quick["steps"]}
    assert steps["device-check"]["status"] == "PASS" and "2/2 chips ready" in steps["device-check"]["key_figure"]
    assert steps["selftest"]["status"] == "SKIP" and "--level standard" in steps["selftest"]["detail"]
    assert quick["verdict"] != "FAIL" and quick["board"]["selftest"] is None
    standard = _accept(tmp_path / "s", accept_lib.Level.STANDARD, None)
    st = {s["name"]: s for s in standard["steps"]}["selftest"]
    assert st["status"] == "WARN" and st["key_figure"].startswith("NOT JUDGED: memory patterns 8/8 PASS")
    assert standard["verdict"] == quick["verdict"]  # NOT JUDGED does not turn the verdict
    assert all(r["status"] != "FAIL" for r in standard["board"]["selftest"]["rows"])


# ---------------------------------------------------------------------------
# The burn-in: --level long only, after the self-test (issue 51 item 6)

FAN_FAILED = "{kind: fan_failed, job: 1, chip: 0, magnitude: 20}"
#: The burn-in's minutes in these tests, through the level setting's override (--burn-in-minutes): 3 s of full
#: load, within which a failed fan shows at any host load (tests/unit/runners/test_burnin.py).
TINY = 0.05
BOARD_THEN_MODEL = (bringup.DEVICE_CHECK, bringup.SELFTEST_STEP, bringup.BURNIN_STEP, bringup.VALIDATE, bringup.BUDGET)


def _bringup_at(tmp_path: Path, level: bringup.Level, plan: Path | None = None) -> dict:
    config = bringup.BringupConfig(
        package=COMBINED,
        trust=_trust(),
        device=DeviceSpec(fault_plan=plan),
        level=level,
        out_dir=tmp_path / "out",
        burnin_minutes=TINY if level is bringup.Level.LONG else None,
    )
    return bringup.run_bringup(config, steps=BOARD_THEN_MODEL).document()


def test_bringup_long_with_a_failed_fan_fails_the_burn_in_naming_chip_and_limit_and_goes_on(tmp_path: Path) -> None:
    doc = _bringup_at(tmp_path, bringup.Level.LONG, _plan(tmp_path, FAN_FAILED))
    got = {s["step"]: s for s in doc["summary"]}
    assert list(got) == ["device-check", "selftest", "burn-in", "validate", "budget"]
    assert got["device-check"]["verdict"] == "PASS" and got["selftest"]["verdict"] == "NOT JUDGED"
    burn = got["burn-in"]
    assert burn["verdict"] == "FAIL", burn
    assert "chip 0 temperature:" in burn["detail"] and "over the limit 90 C" in burn["detail"]
    assert "chip 1" not in burn["detail"]  # the fault is chip 0's own
    assert burn["key_figure"].startswith(f"{TINY:g} min: chip 0 ") and "FAIL: chip 0 temperature" in burn["key_figure"]
    assert got["validate"]["verdict"] in ("PASS", "WARN") and got["budget"]["verdict"] == "GO"  # the run went on
    assert doc["verdict"] == "FAIL" and doc["exit_code"] == 1
    assert doc["error"].startswith("burn-in: chip 0 temperature:") and doc["burn_in_minutes"] == TINY
    # its own report and picture in the run's directory, its figures in report.json
    out = tmp_path / "out"
    assert json.loads((out / "burn-in.json").read_text())["verdict"] == "FAIL"
    assert (out / "burn-in.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert burn["files"] == {"json": str(out / "burn-in.json"), "plot": str(out / "burn-in.png")}
    board = doc["board"]["burn-in"]
    assert board["verdict"] == "FAIL" and board["minutes"] == TINY and board["file"] == "burn-in.json"
    rows = {(r["chip"], r["figure"]): r for r in board["rows"]}
    assert rows[(0, "temperature")]["status"] == "FAIL" and rows[(0, "temperature")]["limit"] == 90.0
    assert rows[(0, "temperature")]["value"] > 90.0 and rows[(1, "temperature")]["status"] == "PASS"
    assert [c["chip"] for c in board["telemetry"]] == [0, 1] and board["telemetry"][0]["temperature_c_max"] > 90.0
    assert "series" not in doc["telemetry"]["burn-in"]  # the samples are the burn-in's own report's
    # the page's first screen (the CLI writes it from this document): the verdict and every reason
    from calctl import html_report

    html_report.write(doc, out / "report.json")
    banner = _page_banner(out / "report.html")
    assert "FAIL" in banner and "chip 0 temperature" in banner and "over the limit 90 C" in banner


def test_bringup_long_on_a_healthy_mock_passes_its_burn_in(tmp_path: Path) -> None:
    doc = _bringup_at(tmp_path, bringup.Level.LONG)
    burn = {s["step"]: s for s in doc["summary"]}["burn-in"]
    assert burn["verdict"] in ("PASS", "WARN"), burn
    assert "chip 0 " in burn["key_figure"] and "/90 C" in burn["key_figure"] and "/45 W" in burn["key_figure"]
    assert doc["verdict"] in ("PASS", "WARN") and doc["exit_code"] == 0
    assert all(r["status"] in ("PASS", "WARN") for r in doc["board"]["burn-in"]["rows"])
    assert doc["step_reports"]["burn-in"]["device_label"] == "mock"  # a mock's thermal model, said so


def test_bringup_quick_and_standard_skip_the_burn_in_saying_how_to_run_it(tmp_path: Path) -> None:
    for level in (bringup.Level.QUICK, bringup.Level.STANDARD):
        doc = _bringup_at(tmp_path / level.value, level)
        burn = {s["step"]: s for s in doc["summary"]}["burn-in"]
        assert burn["verdict"] == "SKIP", burn
        assert f"the burn-in runs at --level long; --level {level.value}" in burn["detail"]
        assert "calctl burn-in --minutes N" in burn["detail"]
        assert doc["board"]["burn-in"] is None and "burn_in_minutes" not in doc
        assert not (tmp_path / level.value / "out" / "burn-in.json").exists()


def test_accept_long_with_a_failed_fan_fails_on_the_burn_in_and_goes_on(tmp_path: Path) -> None:
    from calctl.cli.accept_cmds import junit_suites

    config = accept_lib.AcceptConfig(
        package=COMBINED,
        trust=_trust(),
        device=DeviceSpec(fault_plan=_plan(tmp_path, FAN_FAILED)),
        level=accept_lib.Level.LONG,
        out_dir=tmp_path / "a",
        burnin_minutes=TINY,
    )
    result = accept_lib.run_accept(config, steps=ACCEPT_STEPS[:6])  # the board steps, validate, -replica
    doc = result.document()
    assert doc["verdict"] == "FAIL" and doc["exit_code"] == 1
    assert doc["summary"].startswith("FAIL (the board failed its burn-in: chip 0 temperature:")
    assert "over the limit 90 C" in doc["error"]
    written = json.loads((tmp_path / "a" / "report.json").read_text())
    assert written["level_settings"]["burnin_minutes"] == TINY and written["board"] == json.loads(
        json.dumps(doc["board"])
    )
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps)[:5] == ["device-check", "conformance", "selftest", "burn-in", "validate"]
    assert steps["burn-in"]["status"] == "FAIL" and steps["burn-in"]["files"] == {
        "report": "burn-in.json",
        "plot": "burn-in.png",
    }
    assert steps["validate"]["status"] in ("PASS", "WARN")  # a burn-in FAIL does not stop the run
    failed = [r for r in doc["board"]["burn-in"]["rows"] if r["status"] == "FAIL"]
    assert failed and all(r["chip"] == 0 for r in failed)
    assert {"temperature", "throttle"} <= {r["figure"] for r in failed}
    (suite,) = junit_suites(result)
    case = next(c for c in suite.cases if c.name == "board burn-in")
    assert case.outcome == "failure" and "chip 0 temperature" in case.message
    banner = _page_banner(tmp_path / "a" / "report.html")
    assert "the board failed its burn-in: chip 0 temperature" in banner and "over the limit 90 C" in banner


def test_accept_quick_and_standard_skip_the_burn_in_with_how_to_run_it(tmp_path: Path) -> None:
    for level in (accept_lib.Level.QUICK, accept_lib.Level.STANDARD):
        config = accept_lib.AcceptConfig(
            package=COMBINED, trust=_trust(), device=DeviceSpec(), level=level, out_dir=tmp_path / level.value
        )
        doc = accept_lib.run_accept(config, steps=ACCEPT_STEPS[:4]).document()
        burn = {s["name"]: s for s in doc["steps"]}["burn-in"]
        assert burn["status"] == "SKIP" and f"--level {level.value} does not load the board" in burn["detail"]
        assert doc["board"]["burn-in"] is None and doc["verdict"] != "FAIL"


def test_burn_in_minutes_at_a_level_without_a_burn_in_is_refused_before_anything_runs(cli: Cli, tmp_path: Path) -> None:
    for command in ("bringup", "accept"):
        r = cli(
            command, COMBINED, *TRUST, "--level", "standard", "--burn-in-minutes", "1", "--report", tmp_path / command
        )
        assert_no_traceback(r)
        assert r.code == 2 and "--burn-in-minutes 1" in r.err and "--level long" in r.err, r.err
        assert not (tmp_path / command).exists()
    r = cli("bringup", COMBINED, *TRUST, "--level", "long", "--burn-in-minutes", "0", "--report", tmp_path / "z")
    assert r.code == 2 and "--burn-in-minutes" in r.err


def test_a_board_without_telemetry_leaves_the_burn_in_not_judged_and_the_verdict_unturned(tmp_path: Path) -> None:
    """A shim without the telemetry call: every telemetry row NOT JUDGED (never a pass, never a FAIL), the step
    NOT JUDGED, and the pipeline's verdict is what it is without the burn-in."""
    from calctl.runtime import DeviceKind
    from calctl.runtime._native.build import build_reference

    bare = build_reference(tmp_path / "bare", defines=("-DCALRT_REF_NO_TELEMETRY",)).library

    def run(steps: tuple[bringup.BringupStep, ...], out: str) -> dict:
        config = bringup.BringupConfig(
            package=COMBINED,
            trust=_trust(),
            device=DeviceSpec(DeviceKind.CALRT, bare),
            level=bringup.Level.LONG,
            out_dir=tmp_path / out,
            burnin_minutes=TINY,
        )
        return bringup.run_bringup(config, steps=steps).document()

    doc = run((bringup.DEVICE_CHECK, bringup.BURNIN_STEP), "with")
    burn = {s["step"]: s for s in doc["summary"]}["burn-in"]
    assert burn["verdict"] == "NOT JUDGED", burn
    assert (
        burn["detail"].startswith("not judged: chip 0 temperature:") and "not reported by the runtime" in burn["detail"]
    )
    rows = doc["board"]["burn-in"]["rows"]
    assert {r["status"] for r in rows if r["figure"] != "jobs"} == {"NOT JUDGED"}
    assert all(r["status"] == "PASS" for r in rows if r["figure"] == "jobs")  # the load itself ran
    assert doc["verdict"] == run((bringup.DEVICE_CHECK,), "without")["verdict"] and doc["exit_code"] == 0


def _interrupted_runner(monkeypatch: pytest.MonkeyPatch, module: str, name: str, command: str) -> None:
    """``module.name`` (a board step's runner) reports what it reports when SIGTERM lands in it: INTERRUPTED."""
    import importlib

    from calctl.report import Report

    def interrupted(*args: object, **kwargs: object) -> Report:
        return Report(command, "INTERRUPTED", {"device": "mock"}, {"rows": []}, error="interrupted (SIGTERM)")

    monkeypatch.setattr(importlib.import_module(module), name, interrupted)


@pytest.mark.parametrize(
    ("module", "name", "command", "step"),
    [
        ("calctl.runners.burnin", "run_burnin", "burn-in", "burn-in"),
        ("calctl.runners.selftest", "run_selftest", "device selftest", "selftest"),
    ],
)
def test_a_signal_in_a_board_step_ends_accept_interrupted_not_an_error_that_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, name: str, command: str, step: str
) -> None:
    """The board steps' runners report a signal (INTERRUPTED) rather than raise it: accept once took that for a
    step in ERROR and went on to the next step (a 24 h soak at --level long)."""
    _interrupted_runner(monkeypatch, module, name, command)
    config = accept_lib.AcceptConfig(
        package=COMBINED,
        trust=_trust(),
        device=DeviceSpec(),
        level=accept_lib.Level.LONG,
        out_dir=tmp_path / "a",
        burnin_minutes=TINY,
    )
    doc = accept_lib.run_accept(config, steps=ACCEPT_STEPS[:5]).document()
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps[step]["status"] == "INTERRUPTED", steps[step]
    assert steps["validate"]["status"] == "INTERRUPTED" and steps["validate"]["detail"].startswith("not run:")
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130 and doc["status"] == "interrupted"
    assert "SIGTERM" in steps[step]["detail"]


def test_a_signal_in_the_burn_in_ends_bringup_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupted_runner(monkeypatch, "calctl.runners.burnin", "run_burnin", "burn-in")
    doc = _bringup_at(tmp_path, bringup.Level.LONG)
    got = {s["step"]: s for s in doc["summary"]}
    assert got["burn-in"]["verdict"] == "INTERRUPTED"
    assert got["validate"]["verdict"] == "SKIP" and "interrupted (SIGTERM) in burn-in" in got["validate"]["detail"]
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130
