"""ServingEngine.admin: an admin action that raises is answered ``ok: false`` and logged where it is caught."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from calctl.serving.engine import ServingEngine
from calctl.serving.engine.metrics import EngineMetrics


def test_an_admin_action_that_raises_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def unload() -> None:
        raise RuntimeError("teardown exploded")

    sup = SimpleNamespace(metrics=EngineMetrics(), cores={"model-a": object()}, unload=unload, rollback=unload)
    engine = ServingEngine(sup)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="calctl.serve"):
        out = asyncio.run(engine.admin("model-a", "unload"))
    assert out == {"ok": False, "action": "unload", "detail": "RuntimeError: teardown exploded"}
    [rec] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "admin unload of model-a failed" in rec.getMessage() and rec.exc_info is not None
