"""``calctl burn-in`` (docs/burn-in.md): the healthy mock and reference board pass; each telemetry fault of the mock
turns its row FAIL naming the figure, the chip and the limit; a shim without telemetry is NOT JUDGED, never a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl.runners.burnin import BurnInChipLoad, BurnInLimits, grade, run_burnin
from calctl.runners.device import DeviceSpec
from calctl.runners.telemetry import ChipAggregate
from calctl.runtime import DeviceKind
from calctl.runtime.types import ChipTelemetry
from tests.conftest import Cli

MINUTES = 0.05  # 3 s of full load: the faults below show within it at any host load


def _plan(tmp_path: Path, *rules: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text("schema: calctl-fault-plan/v1\nfaults:\n" + "".join(f"  - {r}\n" for r in rules))
    return path


def _rows(report: object) -> dict[tuple[int, str], dict[str, object]]:
    return {(r["chip"], r["figure"]): r for r in report.body["rows"]}  # type: ignore[attr-defined]


def test_the_healthy_mock_passes_and_draws_its_traces(tmp_path: Path) -> None:
    report = run_burnin(DeviceSpec(), minutes=MINUTES, limits=BurnInLimits(), interval_s=0.2, plot=tmp_path / "b.png")
    assert report.verdict == "PASS" and report.exit_code == 0, report.error
    rows = _rows(report)
    assert {f for _, f in rows} == {
        "temperature", "power", "throttle", "ecc correctable", "ecc uncorrectable", "sensor", "jobs"
    }  # fmt: skip
    assert all(r["status"] == "PASS" for r in rows.values()), rows
    assert rows[(0, "temperature")]["limit"] == 90.0 and rows[(1, "power")]["limit"] == 45.0  # the runtime's own
    assert report.body["limits"]["source"].startswith("defaults")
    series = report.body["telemetry"]["series"]
    assert len(series) > 5 and series[-1]["chips"][0]["temperature_c"] > series[0]["chips"][0]["temperature_c"]
    assert (tmp_path / "b.png").stat().st_size > 0 and report.pictures["plot"] == str(tmp_path / "b.png")
    assert report.header["device_label"] == "mock"


@pytest.mark.parametrize(
    ("rule", "chip", "figure", "words"),
    [
        ("{kind: fan_failed, job: 1, chip: 0, magnitude: 20}", 0, "temperature", "over the limit 90 C"),
        ("{kind: fan_failed, job: 1, chip: 0, magnitude: 20}", 0, "throttle", "(limit 0 s)"),
        ("{kind: stuck_sensor, job: 1, chip: 1}", 1, "sensor", "frozen"),
        ("{kind: ecc_errors, job: 5, chip: 0, count: 2}", 0, "ecc correctable", "2 new error(s)"),
        ("{kind: ecc_errors, job: 5, chip: 1, ecc: uncorrectable}", 1, "ecc uncorrectable", "1 new error(s)"),
    ],
)
def test_each_mock_fault_fails_its_row_naming_figure_chip_and_limit(
    tmp_path: Path, rule: str, chip: int, figure: str, words: str
) -> None:
    spec = DeviceSpec(fault_plan=_plan(tmp_path, rule))
    report = run_burnin(spec, minutes=MINUTES, limits=BurnInLimits(), interval_s=0.2)
    assert report.verdict == "FAIL" and report.exit_code == 1
    row = _rows(report)[(chip, figure)]
    assert row["status"] == "FAIL" and words in str(row["detail"]), row
    assert f"chip {chip} {figure}:" in (report.error or "")
    other = 1 - chip  # the fault is the chip's own: the other chip's row of that figure passes
    assert _rows(report)[(other, figure)]["status"] == "PASS"


def test_the_reference_board_passes_and_a_shim_without_telemetry_is_not_judged(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from calctl.runtime._native.build import build_reference

    ref = build_reference(tmp_path_factory.mktemp("ref")).library
    report = run_burnin(DeviceSpec(DeviceKind.CALRT, ref), minutes=MINUTES, limits=BurnInLimits(), interval_s=0.2)
    assert report.verdict == "PASS", report.error
    assert report.header["device_label"] == "software model"
    bare = build_reference(tmp_path_factory.mktemp("bare"), defines=("-DCALRT_REF_NO_TELEMETRY",)).library
    report = run_burnin(DeviceSpec(DeviceKind.CALRT, bare), minutes=MINUTES, limits=BurnInLimits(), interval_s=0.2)
    assert report.verdict == "WARN" and report.exit_code == 0
    rows = _rows(report)
    assert {r["status"] for (c, f), r in rows.items() if f != "jobs"} == {"NOT JUDGED"}
    assert "not reported by the runtime" in str(rows[(0, "temperature")]["detail"])


def _agg(chip: int, temps: list[float], power: float) -> ChipAggregate:
    a = ChipAggregate(chip)
    for i, t in enumerate(temps):
        a.add(
            ChipTelemetry(
                chip=chip,
                temperature_c=t,
                power_w=power,
                temperature_limit_c=90.0,
                power_limit_w=45.0,
                throttled=False,
                throttle_reasons=(),
                throttled_s=0.0,
                ecc_correctable=0,
                ecc_uncorrectable=0,
            ),
            0.5 if i else 0.0,
        )
    return a


def test_within_five_percent_of_a_limit_is_warn_and_a_profile_limit_wins() -> None:
    loads = [BurnInChipLoad(0, "model-a", jobs=10), BurnInChipLoad(1, "model-b", jobs=10)]
    aggs = {0: _agg(0, [60.0, 86.0], 30.0), 1: _agg(1, [60.0, 70.0], 44.0)}
    rows = {(r.chip, r.figure): r for r in grade(aggs, loads, BurnInLimits())}
    assert (
        rows[(0, "temperature")].status == "WARN" and "within 5% of the limit 90 C" in rows[(0, "temperature")].detail
    )
    assert rows[(1, "power")].status == "WARN" and rows[(1, "temperature")].status == "PASS"
    rows = {(r.chip, r.figure): r for r in grade(aggs, loads, BurnInLimits(temperature_c_max=65.0))}
    assert rows[(1, "temperature")].status == "FAIL" and "over the limit 65 C" in rows[(1, "temperature")].detail


def test_profile_limits_are_read_and_bad_ones_refused(tmp_path: Path, cli: Cli) -> None:
    good = tmp_path / "board.yaml"
    good.write_text("schema: calculet-board-profile/v1\ntelemetry: {temperature_c_max: 80, ecc_correctable_max: 5}\n")
    limits = BurnInLimits.from_profile(good)
    assert limits.temperature_c_max == 80.0 and limits.ecc_correctable_max == 5 and str(good) in limits.source
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: calculet-board-profile/v1\ntelemetry: {temperature_c_max: -3}\n")
    r = cli("burn-in", "--minutes", "0.01", "--board-profile", bad, "--report", tmp_path / "out")
    assert r.code == 2 and "temperature_c_max" in r.err and "Traceback" not in r.err


def test_the_cli_writes_report_page_and_picture_and_exits_1_on_a_fault(tmp_path: Path, cli: Cli) -> None:
    plan = _plan(tmp_path, "{kind: ecc_errors, job: 3, chip: 1, ecc: uncorrectable}")
    out = tmp_path / "burn"
    r = cli("burn-in", "--minutes", MINUTES, "--interval", "0.2", "--fault-plan", plan, "--report", out)
    assert r.code == 1, r.err
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "FAIL" and doc["command"] == "burn-in"
    assert (out / "report.html").is_file() and (out / "burnin.png").is_file()
    assert "chip 1 ecc uncorrectable" in r.out
