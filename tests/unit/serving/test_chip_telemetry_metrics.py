"""001 §14 per-chip telemetry on /metrics: NaN and a gap series where the runtime cannot tell, never 0."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from calctl.runtime.types import ALL_TELEMETRY_FIELDS, TELEMETRY_EXTRA_FIELDS, ChipTelemetry, telemetry_gaps
from calctl.serving.engine.metrics import ChipSnapshot, EngineMetrics, EngineSnapshot, SnapshotCollector


def _scrape(chips: list[ChipSnapshot]) -> dict[str, list[tuple[dict[str, str], float]]]:
    m = EngineMetrics()
    m.add_collector(SnapshotCollector(lambda: EngineSnapshot([], chips)))
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(m.text().decode())}


def test_reported_fields_are_values_and_gaps_are_nan_with_a_gap_series() -> None:
    t = telemetry_gaps(ChipTelemetry(chip=1, reset_count=2, queue_depth=3), "the mock models no thermals")
    fam = _scrape([ChipSnapshot(1, 10, 20, t)])
    assert fam["calctl_chip_resets"] == [({"chip": "1"}, 2.0)]
    assert fam["calctl_chip_queue_depth"] == [({"chip": "1"}, 3.0)]
    ((labels, temp),) = fam["calctl_chip_temperature_celsius"]
    assert labels == {"chip": "1"} and math.isnan(temp)
    gaps = {s[0]["field"] for s in fam["calctl_chip_telemetry_gap"]}
    assert gaps == {"temperature_c", "power_w", "frequency_mhz", "throttled", *TELEMETRY_EXTRA_FIELDS}


def test_a_runtime_without_telemetry_is_all_gaps() -> None:
    fam = _scrape([ChipSnapshot(0, None, None, None)])
    assert all(math.isnan(v) for _, v in fam["calctl_chip_resets"])
    assert len(fam["calctl_chip_telemetry_gap"]) == len(ALL_TELEMETRY_FIELDS)


def test_the_optional_fields_are_gauges_counters_and_reason_flags() -> None:
    t = ChipTelemetry(
        chip=0,
        temperature_c=92.5,
        temperature_limit_c=90.0,
        throttled=True,
        throttle_reasons=("thermal",),
        throttled_s=4.5,
        ecc_correctable=3,
        ecc_uncorrectable=1,
    )
    fam = _scrape([ChipSnapshot(0, 10, 20, t)])
    assert fam["calctl_chip_temperature_limit_celsius"] == [({"chip": "0"}, 90.0)]
    assert fam["calctl_chip_throttled_seconds"] == [({"chip": "0"}, 4.5)]
    ecc = {s[0]["kind"]: s[1] for s in fam["calctl_chip_ecc_errors"]}
    assert ecc == {"correctable": 3.0, "uncorrectable": 1.0}
    reasons = {s[0]["reason"]: s[1] for s in fam["calctl_chip_throttle_reason"]}
    assert reasons == {"thermal": 1.0, "power": 0.0, "hw_slowdown": 0.0, "host": 0.0}
