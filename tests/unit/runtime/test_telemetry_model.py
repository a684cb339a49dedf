"""Per-chip telemetry (docs/calrt-c-abi.md §15): the reference board's call and its broken copies under conformance,
a shim without the call, the mock's thermal model and its faults."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from calctl.package.model import Package
from calctl.runtime import DeviceKind, FaultInjecting, Runtime, open_runtime
from calctl.runtime.conformance import CHECKS, ConformanceTarget, Verdict, run_check
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.mock.thermal import ChipThermal, ThermalModel
from calctl.runtime.types import ALL_TELEMETRY_FIELDS
from tests.unit.runtime.runtime_helpers import PACKAGES

COMBINED = PACKAGES / "combined"
TELEMETRY_CHECKS = [c for c in CHECKS if c.name.startswith("telemetry_")]


def _build(tmp_path_factory: pytest.TempPathFactory, *defines: str) -> Path:
    from calctl.runtime._native.build import build_reference

    return build_reference(tmp_path_factory.mktemp("ref-tel"), defines=defines).library


def _run(lib: Path | None) -> dict[str, object]:
    target = ConformanceTarget(DeviceKind.CALRT, COMBINED, lib) if lib else ConformanceTarget(DeviceKind.MOCK, COMBINED)
    return {c.name: run_check(c, target) for c in TELEMETRY_CHECKS}


def test_the_reference_board_reports_every_field_in_its_units(calrt_reference: Path) -> None:
    with open_runtime("calrt", calrt_lib=calrt_reference) as rt:
        for t in rt.telemetry():
            assert 20 <= (t.temperature_c or 0) <= 100 and t.temperature_limit_c == 90.0
            assert t.power_w is not None and 0 < t.power_w <= (t.power_limit_w or 0)
            assert t.frequency_mhz == t.frequency_max_mhz == 1000.0
            assert t.throttle_reasons == () and t.throttled is False
            assert t.ecc_correctable == 0 and t.ecc_uncorrectable == 0
            assert t.reset_count is None and [g.split(":")[0] for g in t.gaps] == ["reset_count"]


@pytest.mark.parametrize("lib", ["mock", "reference"])
def test_conformance_passes_the_healthy_boards(request: pytest.FixtureRequest, lib: str) -> None:
    results = _run(None if lib == "mock" else request.getfixturevalue("calrt_reference"))
    for r in results.values():
        assert r.verdict is Verdict.PASS, (r.name, r.detail)  # type: ignore[attr-defined]


def test_a_shim_without_the_call_is_unsupported_c4_never_a_pass(tmp_path_factory: pytest.TempPathFactory) -> None:
    lib = _build(tmp_path_factory, "-DCALRT_REF_NO_TELEMETRY")
    for r in _run(lib).values():
        assert r.verdict is Verdict.UNSUPPORTED and "C4" in r.detail and "calrt_chip_telemetry" in r.detail  # type: ignore[attr-defined]
    with open_runtime("calrt", calrt_lib=lib) as rt:
        for t in rt.telemetry():
            assert all(getattr(t, f) is None for f in ALL_TELEMETRY_FIELDS if f != "queue_depth")
            assert len(t.gaps) == len(ALL_TELEMETRY_FIELDS) - 1


@pytest.mark.parametrize(
    ("define", "check", "clause", "words"),
    [
        ("-DCALRT_MUTANT_TELEMETRY_FROZEN", "telemetry_under_load", "TELEM-4", "temperature_c read"),
        ("-DCALRT_MUTANT_TELEMETRY_DECREASING", "telemetry_under_load", "TELEM-3", "ecc_correctable"),
        ("-DCALRT_MUTANT_TELEMETRY_MILLIDEGREES", "telemetry_struct", "TELEM-2", "temperature_c 41000"),
    ],
)
def test_a_broken_telemetry_fails_naming_the_clause(
    tmp_path_factory: pytest.TempPathFactory, define: str, check: str, clause: str, words: str
) -> None:
    r = _run(_build(tmp_path_factory, define))[check]
    assert r.verdict is Verdict.FAIL, r  # type: ignore[attr-defined]
    assert r.detail.startswith(clause) and words in r.detail and clause in r.clauses, r.detail  # type: ignore[attr-defined]


# -- the mock's model ---------------------------------------------------------------------------------------------


def test_temperature_and_power_follow_the_work_on_the_device_clock() -> None:
    th = ChipThermal(ThermalModel(), 0)
    idle = th.reading(0)
    th.work(0, 10 * 10**9)  # 10 s of compute: one time constant
    hot = th.reading(10 * 10**9)
    assert idle["temperature_c"] == 41.0 and hot["temperature_c"] == pytest.approx(41 + 34 * (1 - math.exp(-1)), 0.01)
    assert hot["power_w"] == pytest.approx(40.0, 0.01) and not hot["throttled"]
    th.reading(60 * 10**9)  # 50 s idle: it cools
    assert th.temp_c < 45


def test_a_failed_fan_throttles_past_the_limit_and_halves_the_clock() -> None:
    th = ChipThermal(ThermalModel(), 0)
    th.fan_factor = 4.0
    for s in range(60):
        th.work(s * 10**9, (s + 1) * 10**9)
    r = th.reading(60 * 10**9)
    assert r["throttled"] and r["frequency_mhz"] == 500.0 and r["throttled_s"] > 0
    assert th.clock_factor == 0.5


def _load(rt: Runtime, pkg: Package, seconds: float) -> int:
    from calctl.runtime.conformance import prefill_job

    stop = threading.Event()
    done = [0]

    def loop(alias: str) -> None:
        while not stop.is_set():
            job, seq, i, o = prefill_job(rt, pkg, alias)
            rt.wait(job, 30.0)
            rt.kv.free(seq)
            rt.release_buffer(i)
            rt.release_buffer(o)
            done[0] += 1

    threads = [threading.Thread(target=loop, args=(a,)) for a in pkg.aliases]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    return done[0]


def test_mock_faults_show_in_its_telemetry(combined: Package) -> None:
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(combined))
        assert isinstance(rt, FaultInjecting)
        rt.arm_fault(FaultRule(FaultKind.STUCK_SENSOR, at=(1,), chip=0))
        rt.arm_fault(FaultRule(FaultKind.ECC_ERRORS, at=(2,), chip=1, count=3))
        rt.arm_fault(FaultRule(FaultKind.ECC_ERRORS, at=(3,), chip=1, ecc="uncorrectable"))
        before = rt.telemetry()
        assert _load(rt, combined, 1.0) > 3
        after = rt.telemetry()
    assert after[0].temperature_c == before[0].temperature_c  # frozen where it was
    assert after[1].temperature_c is not None and after[1].temperature_c > (before[1].temperature_c or 0)
    assert (after[1].ecc_correctable, after[1].ecc_uncorrectable) == (3, 1)
    assert (after[0].ecc_correctable, after[0].ecc_uncorrectable) == (0, 0)


def test_the_telemetry_faults_parse_and_bad_knobs_are_named() -> None:
    from calctl.errors import ConfigError
    from calctl.runtime.mock.faults import FaultPlan

    plan = FaultPlan.from_document(
        {
            "schema": "calctl-fault-plan/v1",
            "faults": [
                {"kind": "fan_failed", "job": 1, "chip": 0},
                {"kind": "stuck_sensor", "probability": 0.5},
                {"kind": "ecc_errors", "job": [2, 3], "ecc": "uncorrectable", "count": 4},
            ],
        }
    )
    fan, _, ecc = plan.rules
    assert fan.magnitude == 4.0 and (ecc.ecc, ecc.count) == ("uncorrectable", 4)
    for rule, words in (
        ({"kind": "corrupt_output", "job": 1, "ecc": "correctable"}, "ecc applies only to ecc_errors"),
        ({"kind": "fan_failed", "job": 1, "magnitude": 0.5}, "fan_failed magnitude"),
        ({"kind": "ecc_errors", "job": 1, "ecc": "some"}, "/faults/0/ecc"),
    ):
        with pytest.raises(ConfigError, match=words):
            FaultPlan.from_document({"schema": "calctl-fault-plan/v1", "faults": [rule]})
