"""The DeviceSupervisor's lifecycle answers are frozen values, and the admin API's JSON of each is pinned.

The keys and their order are the admin API's documented responses (docs/serve.md, ``POST
/internal/models/{alias}/{action}``); the runners read the same answers as attributes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest

from calctl.serving.engine import LoadResult, ReloadResult, RollbackResult, ServingEngine, UnloadResult
from calctl.serving.engine.device_check import ChipCheck, DeviceCheck
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.recovery import RecoveryRecord
from calctl.serving.engine.results import NOTHING_SERVED, PREVIOUS_GENERATION, ROLLED_BACK

CLEAN = DeviceCheck((ChipCheck(0, 10, 10, 0, "ok"),), (), ("chip 0: health",))
LEAK = DeviceCheck((ChipCheck(0, 20, 10, 0, "ok"),), ("chip 0: 10 bytes still in use (20 used, 10 idle)",), ())


def _keys_and_values(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(json.loads(json.dumps(doc)).items())


@pytest.mark.parametrize(
    ("result", "want"),
    [
        (LoadResult(True, generation=3, digest="d1"), {"ok": True, "action": "load", "generation": 3, "digest": "d1"}),
        (
            LoadResult(False, "a package is loaded; use reload"),
            {"ok": False, "action": "load", "detail": "a package is loaded; use reload"},
        ),
        (
            LoadResult(False, "bad hash", NOTHING_SERVED),
            {"ok": False, "action": "load", "detail": "bad hash", "serving": "nothing (unloaded)"},
        ),
        (
            LoadResult(False, "golden failed", ROLLED_BACK, digest="d0"),
            {
                "ok": False,
                "action": "load",
                "detail": "golden failed",
                "serving": "rolled back to the previous package",
                "digest": "d0",
            },
        ),
        (
            ReloadResult(True, generation=4, digest="d2"),
            {"ok": True, "action": "reload", "generation": 4, "digest": "d2"},
        ),
        (
            ReloadResult(False, "bad hash", PREVIOUS_GENERATION),
            {"ok": False, "action": "reload", "detail": "bad hash", "serving": "previous generation"},
        ),
        (
            ReloadResult(False, "golden failed", ROLLED_BACK),
            {
                "ok": False,
                "action": "reload",
                "detail": "golden failed",
                "serving": "rolled back to the previous package",
            },
        ),
        (
            UnloadResult(False, detail="nothing is loaded"),
            {"ok": False, "action": "unload", "detail": "nothing is loaded"},
        ),
        (
            UnloadResult(True, ("model-a", "model-b"), True, CLEAN),
            {
                "ok": True,
                "action": "unload",
                "aliases": ["model-a", "model-b"],
                "drained_in_time": True,
                "device_check": {
                    "ok": True,
                    "chips": [{"chip": 0, "used_bytes": 10, "idle_bytes": 10, "pending_jobs": 0, "health": "ok"}],
                    "problems": [],
                    "not_reported": ["chip 0: health"],
                },
            },
        ),
        (
            UnloadResult(False, ("model-a",), False, LEAK, "unload left the device unclean: chip 0: 10 bytes"),
            {
                "ok": False,
                "action": "unload",
                "aliases": ["model-a"],
                "drained_in_time": False,
                "device_check": {
                    "ok": False,
                    "chips": [{"chip": 0, "used_bytes": 20, "idle_bytes": 10, "pending_jobs": 0, "health": "ok"}],
                    "problems": ["chip 0: 10 bytes still in use (20 used, 10 idle)"],
                    "not_reported": [],
                },
                "detail": "unload left the device unclean: chip 0: 10 bytes",
            },
        ),
        (
            RollbackResult(None, refusal="no previous package is retained"),
            {"ok": False, "action": "rollback", "detail": "no previous package is retained"},
        ),
        (
            RollbackResult(ReloadResult(True, generation=5, digest="d0"), "/pkgs/old"),
            {"ok": True, "action": "rollback", "generation": 5, "digest": "d0", "package": "/pkgs/old"},
        ),
        (
            RollbackResult(LoadResult(False, "golden failed", ROLLED_BACK, digest="d1"), "/pkgs/old"),
            {
                "ok": False,
                "action": "rollback",
                "detail": "golden failed",
                "serving": "rolled back to the previous package",
                "digest": "d1",
                "package": "/pkgs/old",
            },
        ),
    ],
)
def test_each_lifecycle_answer_is_the_documented_json_in_its_order(result: Any, want: dict[str, Any]) -> None:
    assert _keys_and_values(result.to_json()) == list(want.items())


def test_lifecycle_answers_are_frozen_and_read_as_attributes() -> None:
    back = RollbackResult(ReloadResult(False, "hash mismatch", PREVIOUS_GENERATION), "/pkgs/old")
    assert not back.ok and back.detail == "hash mismatch" and back.package == "/pkgs/old"
    assert RollbackResult(None, refusal="none kept").detail == "none kept"
    assert UnloadResult(True, ("a",), False, LEAK).device_check is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.package = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        LEAK.problems = ()  # type: ignore[misc]


def test_a_recovery_record_is_frozen() -> None:
    rec = RecoveryRecord("model-a", "TIMEOUT", None, "board", ("model-a",), True, 0.5, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.ok = False  # type: ignore[misc]


def test_the_admin_api_sends_the_answer_as_json() -> None:
    """ServingEngine.admin turns the supervisor's typed answer into the response document."""
    answer = UnloadResult(True, ("model-a",), True, CLEAN)
    sup = SimpleNamespace(metrics=EngineMetrics(), cores={"model-a": object()}, unload=lambda: answer, rollback=None)
    out = asyncio.run(ServingEngine(sup).admin("model-a", "unload"))  # type: ignore[arg-type]
    assert dict(out) == answer.to_json() and out["device_check"]["ok"] is True
