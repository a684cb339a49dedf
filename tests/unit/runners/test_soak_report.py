"""The soak's report header, built from its typed state (calctl.runners.soak.state.SoakHeader)."""

from __future__ import annotations

from pathlib import Path

from calctl.runners.device import DeviceSpec
from calctl.runners.soak import render
from calctl.runners.soak.run import SoakConfig, _Soak
from calctl.runners.soak.state import PackageFacts, ValidationFacts
from calctl.runtime import DeviceKind
from calctl.runtime.types import Versions
from calctl.signing.policy import TrustPolicy


def _soak(tmp_path: Path, kind: DeviceKind) -> _Soak:
    cfg = SoakConfig(package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(kind), out_dir=tmp_path / "s", cycles=1)
    return _Soak(cfg, None)


def test_a_runtime_that_says_it_is_a_software_model_is_labelled_so(tmp_path: Path) -> None:
    """Hardware honesty (docs/runtime.md §5): the soak kept only four of the runtime's versions, so a shim whose
    identity says "software model" (and whose firmware string does not) was labelled a board in soak-report.json."""
    s = _soak(tmp_path, DeviceKind.CALRT)
    try:
        s.header.runtime = Versions("vendor 2.1", "drv 7", "fw 3.0.1", "1.2", software_model=True)
        doc = render.report(s).document()
        assert doc["runtime"]["software_model"] is True, doc["runtime"]
        assert doc["device_label"] == "software model" and doc["note"].startswith("SOFTWARE MODEL RESULT"), doc
    finally:
        s.events.close()


def test_the_header_says_the_package_and_its_validation_as_before(tmp_path: Path) -> None:
    s = _soak(tmp_path, DeviceKind.MOCK)
    try:
        s.header.package = PackageFacts(str(tmp_path), "pkg", "1.0.0", "combined", ("a", "b"), "sha256:x", "k1")
        s.header.validation = ValidationFacts(True, (), ("SIG002",))
        s.header.runtime = Versions("mock 1", "mock", "mock fw", "1.2")
        doc = render.report(s).document()
        assert doc["package"] == {
            "path": str(tmp_path),
            "name": "pkg",
            "version": "1.0.0",
            "kind": "combined",
            "aliases": ["a", "b"],
            "digest": "sha256:x",
            "signer_key_id": "k1",
        }
        assert doc["validation"] == {"ok": True, "failed_rules": [], "warnings": ["SIG002"]}
        assert doc["device_label"] == "mock" and doc["runtime"]["firmware"] == "mock fw"
        assert doc["files"] == {
            "report": str(tmp_path / "s" / "soak-report.json"),
            "events": str(tmp_path / "s" / "events.ndjson"),
            "plot": None,
        }
        assert doc["interrupted"] is None and doc["cycle_records"] == []
    finally:
        s.events.close()
