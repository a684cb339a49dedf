"""Every device run samples per-chip telemetry into its report (docs/runtime.md §9): bounded memory, figures or
"not reported by the runtime" (never 0), the sampler ends with the device."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calctl.runners.device import DeviceSpec
from calctl.runners.telemetry import NOT_REPORTED, TelemetrySampler, sampler_of
from calctl.runtime.types import ChipTelemetry
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli
from tests.waiting import wait_until


class _FakeRuntime:
    """Just what the sampler reads: telemetry() and closed."""

    def __init__(self, readings: Sequence[tuple[ChipTelemetry, ...]]) -> None:
        self.readings = readings
        self.i = 0
        self.closed = False

    def telemetry(self) -> tuple[ChipTelemetry, ...]:
        r = self.readings[min(self.i, len(self.readings) - 1)]
        self.i += 1
        return r


def _t(chip: int, **kw: Any) -> ChipTelemetry:
    return ChipTelemetry(chip=chip, **kw)


def test_aggregates_over_every_sample_and_keeps_a_bounded_series() -> None:
    readings = [
        (_t(0, temperature_c=40.0 + i, power_w=10.0 + i % 3, ecc_correctable=i // 100, throttled=False),)
        for i in range(1000)
    ]
    rt = _FakeRuntime(readings)
    s = TelemetrySampler(rt, keep=50)  # type: ignore[arg-type]
    for _ in range(1000):
        s.sample()
    doc = s.document(with_series=True)
    (chip,) = doc["chips"]
    assert chip["samples"] == 1000 and chip["temperature_c_max"] == 1039.0 and chip["power_w_max"] == 12.0
    assert chip["ecc_correctable_delta"] == 9 and chip["throttled_s"] == 0.0
    assert 25 <= len(doc["series"]) < 50  # halved when full: the whole run, in bounded memory
    assert doc["series"][0]["t_s"] <= doc["series"][-1]["t_s"]
    # what the runtime did not report is null and named, never 0
    assert chip["ecc_uncorrectable_delta"] is None and chip["not_reported"]["ecc_uncorrectable_delta"] == NOT_REPORTED


def test_a_counter_that_decreases_is_recorded() -> None:
    rt = _FakeRuntime([(_t(0, ecc_correctable=5),), (_t(0, ecc_correctable=3),)])
    s = TelemetrySampler(rt)  # type: ignore[arg-type]
    s.sample()
    s.sample()
    assert s.document()["chips"][0]["counters_decreased"] == ["ecc_correctable 5 -> 3"]


def test_the_sampler_stops_when_the_device_closes() -> None:
    rt = _FakeRuntime([(_t(0, temperature_c=41.0),)])
    s = TelemetrySampler(rt, interval_s=0.05).start()  # type: ignore[arg-type]
    wait_until(lambda: rt.i >= 3, what="three samples")
    rt.closed = True
    wait_until(lambda: not s.running, what="the sampler to end")
    n = rt.i
    second = _FakeRuntime([(_t(0),)])  # held: a sampler holds its runtime weakly and ends when it is gone
    other = TelemetrySampler(second, interval_s=0.05).start()  # type: ignore[arg-type]
    wait_until(lambda: other.document()["samples"] >= 3, what="the ticker to serve a new sampler")
    other.stop()
    assert rt.i == n  # the closed one is not read again


def test_every_device_a_runner_opens_is_sampled() -> None:
    with DeviceSpec().open() as rt:
        sampler = sampler_of(rt)
        assert sampler is not None
    assert sampler.document()["chips"][0]["temperature_c_max"] == 41.0
    with DeviceSpec().open(sample=False) as rt:
        assert sampler_of(rt) is None


def test_run_golden_reports_the_runs_telemetry(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "golden.json"
    r = cli("run-golden", FIXTURE_PACKAGES / "combined", "--trusted-key", TEST_PUB, "--report", out)
    assert r.code == 0, r.err
    tel = json.loads(out.read_text())["telemetry"]
    assert [c["chip"] for c in tel["chips"]] == [0, 1]
    for c in tel["chips"]:
        assert c["samples"] >= 2 and c["temperature_c_max"] >= 41.0 and c["power_w_avg"] > 0
        assert c["ecc_uncorrectable_delta"] == 0 and c["limits"] == {"temperature_limit_c": 90.0, "power_limit_w": 45.0}


def test_device_watch_streams_json_lines_and_a_table(cli: Cli) -> None:
    r = cli("device", "watch", "--count", "3", "--interval", "0.05", "--format", "jsonl")
    assert r.code == 0, r.err
    lines = [json.loads(line) for line in r.out.splitlines()]
    assert len(lines) == 3 and all(x["device"] == "mock" and x["simulated"] for x in lines)
    assert [c["chip"] for c in lines[0]["chips"]] == [0, 1] and lines[0]["chips"][0]["temperature_c"] == 41.0
    r = cli("device", "watch", "--count", "1", "--interval", "0.05")
    assert r.code == 0 and "temp °C" in r.out and "sample 1" in r.out
    r = cli("device", "watch", "--interval", "0")
    assert r.code == 2 and "--interval" in r.err


def test_device_watch_on_a_shim_without_telemetry_shows_na(cli: Cli, tmp_path_factory: Any) -> None:
    from calctl.runtime._native.build import build_reference

    lib = build_reference(tmp_path_factory.mktemp("bare"), defines=("-DCALRT_REF_NO_TELEMETRY",)).library
    r = cli("device", "watch", "--device", "calrt", "--calrt-lib", lib, "--count", "1", "--format", "jsonl")
    assert r.code == 0, r.err
    chip = json.loads(r.out)["chips"][0]
    assert chip["temperature_c"] is None and chip["ecc_correctable"] is None
    assert any(g.startswith("temperature_c: ") for g in chip["vendor_gaps"])


def test_the_timeline_draws_the_chips_telemetry_under_the_lanes(tmp_path: Path) -> None:
    from calctl.runners.telemetry import telemetry_points
    from calctl.runners.trace import TraceSlice, plot_timeline

    doc = {
        "t0_monotonic_s": 100.0,
        "series": [
            {"t_s": t, "chips": [{"chip": c, "temperature_c": 41.0 + t + c, "power_w": None} for c in (0, 1)]}
            for t in (0.0, 0.5, 1.0)
        ],
    }
    points = telemetry_points(doc)
    assert points[0] == (100.0, 0, 41.0, None) and len(points) == 6
    assert telemetry_points({"chips": []}) == []  # a block without a series draws nothing
    slices = [TraceSlice(0, 100.1, 100.2, "model-a", "model_a_prefill", "ping", 1, None)]
    out = tmp_path / "t.png"
    plot_timeline(out, slices, title="t", device="mock", telemetry=points)
    assert out.stat().st_size > 0
