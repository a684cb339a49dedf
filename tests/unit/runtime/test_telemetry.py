"""001 §14 per-chip telemetry: reported where the runtime can, null and a listed vendor gap where it cannot."""

from __future__ import annotations

from pathlib import Path

from calctl.package.model import Package
from calctl.runtime import Runtime, open_runtime
from calctl.runtime.types import ALL_TELEMETRY_FIELDS
from tests.conftest import Cli


def test_every_backend_reports_every_field_or_names_the_gap(rt: Runtime) -> None:
    tel = rt.telemetry()
    assert [t.chip for t in tel] == list(range(rt.topology().chips))
    for t in tel:
        doc = t.document()
        assert list(doc) == [*ALL_TELEMETRY_FIELDS, "vendor_gaps"]  # never omitted
        missing = [f for f in ALL_TELEMETRY_FIELDS if doc[f] is None]
        gaps = doc["vendor_gaps"]
        assert isinstance(gaps, list), gaps
        assert [g.split(":")[0] for g in gaps] == missing  # every null is a listed gap
        if rt.kind.value == "mock":  # the mock models thermals, power and clocks (docs/runtime.md §9)
            assert not missing and doc["temperature_c"] == 41.0 and doc["throttled"] is False
        elif "calrt_chip_telemetry" not in rt.library.extensions:  # type: ignore[attr-defined]
            # a shim without the optional call: null, never a made-up 0
            assert doc["temperature_c"] is None and doc["power_w"] is None and doc["frequency_mhz"] is None
            assert doc["throttled"] is None


def test_the_mock_counts_its_resets_and_its_queue(combined: Package) -> None:
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(combined))
        assert [t.reset_count for t in rt.telemetry()] == [0, 0]
        rt.reset("chip", chip=1)
        assert [t.reset_count for t in rt.telemetry()] == [0, 1]
        assert [t.queue_depth for t in rt.telemetry()] == [0, 0]


def test_device_info_shows_telemetry_and_gaps(cli: Cli, calrt_stub: Path) -> None:
    r = cli("device", "info", "--format", "json")
    assert r.code == 0, r.err
    chip = r.json["chips"][0]["telemetry"]
    assert chip["reset_count"] == 0 and chip["temperature_c"] == 41.0 and chip["vendor_gaps"] == []
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub, "--format", "json")
    assert r.code == 0, r.err
    chip = r.json["chips"][1]["telemetry"]
    assert chip["reset_count"] is None
    assert any(g.startswith("reset_count: libcalrt has no per-chip query") for g in chip["vendor_gaps"])
    table = cli("device", "info", "--device", "calrt", "--calrt-lib", calrt_stub)
    assert "telemetry (001 §14" in table.out and "vendor gaps: " in table.out
