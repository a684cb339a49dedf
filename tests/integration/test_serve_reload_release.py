"""Unload, reload, rollback and board recovery give back what the old generation held (issue 49, 000 §12, M4).

The supervisor used to create a calbin at every configure and never release one: every cycle kept the previous
model's calbin, the mock's prepared weights (``LoadedModel``) and, on a board, the vendor's calbin handle.
These tests run 100 cycles in-process and count what is still alive, on the mock (Python objects, through
``gc``) and on the reference C board (the vendor's ``calrt_calbin_create`` and ``calrt_calbin_release`` calls).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from calctl.runtime import open_runtime
from calctl.runtime._native.backend import CalrtRuntime
from calctl.runtime.calbin import Calbin
from calctl.runtime.mock import MockRuntime
from calctl.runtime.mock.compute import LoadedModel
from calctl.runtime.mock.kv import KvSequence
from calctl.serving.core.scheduler import JobStatus
from calctl.serving.engine import DeviceSupervisor, SupervisorOptions
from calctl.serving.engine.loop import RecoveryRequest
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow  # ~50 s of load cycles on a loaded 2-core host

COMBINED = FIXTURE_PACKAGES / "combined"
CYCLES = 100


def _live(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, cls))


@contextmanager
def _supervisor(rt: Any) -> Iterator[DeviceSupervisor]:
    sup = DeviceSupervisor(
        rt,
        trust=make_policy([TEST_PUB]),
        options=SupervisorOptions(warmup_iterations=1, drain_deadline_s=5.0, max_resets_per_10min=1000),
    )
    try:
        sup.start(COMBINED)
        yield sup
    finally:
        sup.shutdown(2.0)


def _board_recovery(sup: DeviceSupervisor) -> None:
    rec = sup.recover(RecoveryRequest("model-a", JobStatus.TIMEOUT, "test: a board recovery", None))
    assert rec.ok and rec.scope == "board", rec


def _cycle(sup: DeviceSupervisor, i: int, seen: Callable[[], None]) -> None:
    """One cycle: unload + load, reload; every 10th a rollback and a board recovery too. ``seen`` after each."""
    assert sup.unload().ok
    assert sup.load().ok
    seen()
    assert sup.reload().ok
    seen()
    if i % 10 == 0:
        assert sup.rollback().ok
        seen()
        _board_recovery(sup)
        seen()


def test_a_hundred_cycles_on_the_mock_leave_one_calbin_and_its_models_alive() -> None:
    with open_runtime("mock", time_scale=0.0) as opened, _supervisor(opened) as sup:
        rt = cast(MockRuntime, opened)
        calbins: list[weakref.ref[Calbin]] = []

        def seen() -> None:
            assert rt.current_calbin is not None
            calbins.append(weakref.ref(rt.current_calbin))

        seen()
        start = (_live(Calbin), _live(LoadedModel), _live(KvSequence), len(rt._buffers))
        for i in range(CYCLES):
            _cycle(sup, i, seen)
        alive = [c for c in calbins if c() is not None]
        # Only the configured calbin is left: each earlier one was released and collected.
        assert [c() for c in alive] == [rt.current_calbin], f"{len(alive)} of {len(calbins)} calbins alive"
        assert len(rt._calbins) == 1
        assert (_live(Calbin), _live(LoadedModel), _live(KvSequence), len(rt._buffers)) == start
        assert sup.unload().ok
        # 000 §12: an unload frees the calbin and its prepared weights, not only at the next load.
        assert rt.current_calbin is None and rt._calbins == {} and rt._buffers == {}
        assert _live(Calbin) == 0 and _live(LoadedModel) == 0


def _counting(monkeypatch: pytest.MonkeyPatch, fn: Any, name: str, calls: list[str]) -> None:
    real = getattr(fn, name)

    def call(*args: Any) -> Any:
        rc = real(*args)
        if rc == 0:
            calls.append(name)
        return rc

    monkeypatch.setattr(fn, name, call)


def test_a_hundred_cycles_on_the_reference_board_destroy_each_vendor_calbin(
    reference_board: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CALRT_REF_TIME_SCALE", "0")
    with open_runtime("calrt", calrt_lib=reference_board) as opened:
        rt = cast(CalrtRuntime, opened)
        calls: list[str] = []
        for name in ("calrt_calbin_create", "calrt_calbin_release"):
            _counting(monkeypatch, rt._fn, name, calls)
        with _supervisor(rt) as sup:
            for i in range(CYCLES // 4):
                _cycle(sup, i, lambda: None)
            created, released = calls.count("calrt_calbin_create"), calls.count("calrt_calbin_release")
            # Every vendor calbin but the configured one was destroyed (C ABI calrt_calbin_release).
            assert created >= 2 * (CYCLES // 4) and created - released == 1, (created, released)
            assert len(rt._calbins) == 1
            assert sup.unload().ok
            assert calls.count("calrt_calbin_create") == calls.count("calrt_calbin_release")
