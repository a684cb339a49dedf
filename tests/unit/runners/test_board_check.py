"""The readiness proof on boards the CLI cannot make: a chip missing from the topology, a health the runtime
cannot tell. A missing chip is never ready (NVIDIA/gpu-operator#2685: Ready while a device node is missing);
an unknown health is ready on the known answer alone, and says so."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calctl.runners import board_check
from calctl.runners.device import DeviceSpec
from calctl.runtime import ChipHealth, Health, open_runtime


def _spec(monkeypatch: pytest.MonkeyPatch, **mock: Any) -> DeviceSpec:
    spec = DeviceSpec()
    monkeypatch.setattr(DeviceSpec, "open", lambda self: open_runtime("mock", **mock))
    return spec


def test_a_board_with_one_chip_is_not_ready_naming_the_missing_chip(monkeypatch: pytest.MonkeyPatch) -> None:
    report = board_check.check_board(_spec(monkeypatch, chips=1))
    doc = report.document()
    assert report.exit_code == 1 and doc["ready"] is False
    chips = {c["chip"]: c for c in doc["chips"]}
    assert chips[1]["present"] is False and chips[1]["why"].startswith("missing: the runtime reports 1 chip(s)")
    assert chips[0]["ready"] is False and "no known-answer job ran: chip 1 missing" in chips[0]["why"]
    assert doc["error"].startswith("chip 1: missing")
    steps = {s["name"]: s["status"] for s in doc["steps"]}
    assert steps["topology"] == "FAIL" and steps["known answer chip 0"] == "SKIP"
    assert doc["package"]["digest"]  # the known answers' seal was still checked and named


def test_an_unknown_health_is_ready_on_the_known_answer_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from calctl.runtime.mock.board import MockRuntime

    def unknown(self: MockRuntime) -> tuple[ChipHealth, ...]:
        return tuple(dataclasses.replace(h, health=Health.UNKNOWN, detail=None) for h in real(self))

    real = MockRuntime.health
    monkeypatch.setattr(MockRuntime, "health", unknown)
    report = board_check.check_board(_spec(monkeypatch))
    doc = report.document()
    assert report.exit_code == 0 and doc["verdict"] == "WARN" and doc["ready"] is True
    assert all(c["known_answer"]["status"] == "PASS" and c["health"] == "unknown" for c in doc["chips"])
    assert {s["name"]: s["status"] for s in doc["steps"]}["health chip 0"] == "WARN"
