"""The reference board (calctl/runtime/_native/reference/) below the Runtime: its C ABI model extension
attacked with bad descriptions, configure without one, and its environment fault switches."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import pytest

from calctl.package.reader import load_manifest
from calctl.runtime import open_runtime
from calctl.runtime._native import ext
from calctl.runtime._native import lib as L
from calctl.runtime._native.backend import CalrtRuntime
from calctl.runtime.errors import DeviceLost, InvalidCalbin, NotSupported, RuntimeStatus
from tests.conftest import FIXTURE_PACKAGES

# -- the reference board's model extension (calrt_ext.h), attacked -----------------------------


def _model_set(rt, calbin, desc) -> int:
    handle = rt._calbins[calbin.id][1]
    return int(rt._fn.calrt_ext_model_set(rt._dev, handle, ctypes.byref(desc)))


def test_reference_board_refuses_bad_model_descriptions(calrt_reference: Path) -> None:
    pkg = load_manifest(FIXTURE_PACKAGES / "combined")
    model = pkg.model("model-a")
    with open_runtime("calrt", calrt_lib=calrt_reference) as rt:
        assert isinstance(rt, CalrtRuntime)
        assert rt.library.has("calrt_ext_model_set") and rt.library.has("calrt_ext_fault_set")
        calbin = rt.create_calbin(pkg)
        keep: list[object] = []
        assert _model_set(rt, calbin, ext.model_desc(model, keep)) == RuntimeStatus.OK  # the real one is fine
        for path in (b"../../../../etc/passwd", b"/etc/passwd", b"model-a/../../x.bin", b"", b"model-a//params"):
            desc = ext.model_desc(model, keep)
            desc.params[0].file = path
            assert _model_set(rt, calbin, desc) == RuntimeStatus.INVALID_CALBIN, path
        tampered = [
            ("elements", 7),
            ("role", 99),
            ("dtype", 4),  # int32 parameters: not a float blob
            ("offset", 1 << 40),  # past the end of the file
        ]
        for field, value in tampered:
            desc = ext.model_desc(model, keep)
            setattr(desc.params[3], field, value)
            assert _model_set(rt, calbin, desc) == RuntimeStatus.INVALID_CALBIN, field
        desc = ext.model_desc(model, keep)
        desc.n_params -= 1  # a tensor missing (the lm_head of an untied model)
        assert _model_set(rt, calbin, desc) == RuntimeStatus.INVALID_CALBIN
        desc = ext.model_desc(model, keep)
        desc.n_heads = 3  # not a multiple of the kv heads
        assert _model_set(rt, calbin, desc) == RuntimeStatus.INVALID_CALBIN
        desc = ext.model_desc(model, keep)
        desc.version = 2
        assert _model_set(rt, calbin, desc) == RuntimeStatus.NOT_SUPPORTED
        desc = ext.model_desc(model, keep)
        desc.alias = b"model-z"
        assert _model_set(rt, calbin, desc) == RuntimeStatus.INVALID_ARGUMENT
        rt.configure(calbin)
        assert (
            _model_set(rt, calbin, ext.model_desc(model, keep)) == RuntimeStatus.DEVICE_BUSY
        )  # not under a current calbin


def test_reference_board_without_the_model_description_refuses_configure(calrt_reference: Path) -> None:
    library = dataclasses.replace(L.load_library(calrt_reference), extensions=frozenset())
    with CalrtRuntime(library) as rt:
        calbin = rt.create_calbin(load_manifest(FIXTURE_PACKAGES / "combined"))
        with pytest.raises(InvalidCalbin, match="configure"):
            rt.configure(calbin)


def test_a_parameter_without_a_role_is_named(calrt_reference: Path) -> None:
    model = load_manifest(FIXTURE_PACKAGES / "combined").model("model-a")
    odd = dataclasses.replace(model.params[1], name="layers.0.mystery")
    broken = dataclasses.replace(model, params=(model.params[0], odd, *model.params[2:]))
    with pytest.raises(InvalidCalbin, match=r"'layers\.0\.mystery' has no role"):
        ext.model_desc(broken, [])


def test_reference_board_fault_switches_from_the_environment(
    calrt_reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALRT_REF_FAULTS", "no_chip_memory=1,no_chip_reset=1")
    with open_runtime("calrt", calrt_lib=calrt_reference) as rt:
        assert [m.used_bytes for m in rt.memory_usage()] == [None, None]
        with pytest.raises(NotSupported):
            rt.reset("chip", chip=0)


def test_reference_board_reset_fail_switch_fails_the_next_resets(
    calrt_reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CALRT_REF_FAULTS=reset_fail=N`` (issue 29 item 3): the next N resets return DEVICE_LOST and reset
    nothing (the configuration stays); then resets work again. Also armed through ``calrt_ext_fault_set``."""
    monkeypatch.setenv("CALRT_REF_FAULTS", "reset_fail=2")
    with open_runtime("calrt", calrt_lib=calrt_reference) as rt:
        assert isinstance(rt, CalrtRuntime)
        rt.configure(rt.create_calbin(load_manifest(FIXTURE_PACKAGES / "combined")))
        for scope, chip in (("chip", 0), ("board", None)):
            with pytest.raises(DeviceLost) as exc:
                rt.reset(scope, chip)
            assert exc.value.status == RuntimeStatus.DEVICE_LOST and rt.current_calbin is not None
        rt.reset("board")
        assert rt.current_calbin is None
        rt.arm_test_fault("reset_fail", 1)
        with pytest.raises(DeviceLost):
            rt.reset("board")
        rt.reset("board")
