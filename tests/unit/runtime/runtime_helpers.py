"""Helpers shared by the runtime tests (fixtures are in conftest.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calctl.package.model import Graph, InactiveLanePolicy, Package
from calctl.package.reader import load_manifest
from calctl.runtime import Runtime
from calctl.runtime._native.backend import CalrtRuntime
from calctl.runtime.conformance import golden_prompt, prefill_job, write_decode, write_prefill
from calctl.runtime.mock import FaultKind, FaultRule, MockRuntime

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ROOT / "fixtures" / "packages"
NATIVE = ROOT / "tests" / "native"

# calrt_ext_fault_set codes (calctl/runtime/_native/reference/calrt_ext.h)
STUB_FAULT = {"busy": 1, "hang": 2, "ccu": 3, "no_chip_memory": 4, "delay_ms": 5, "dma": 6, "no_chip_reset": 7}

_PACKAGE_CACHE: dict[str, Package] = {}


def package(kind: str) -> Package:
    """A fixture package (single | combined | replica), loaded once."""
    if kind not in _PACKAGE_CACHE:
        _PACKAGE_CACHE[kind] = load_manifest(PACKAGES / kind)
    return _PACKAGE_CACHE[kind]


def b4_package(pkg: Package, alias: str = "model-a") -> tuple[Package, Graph]:
    """``pkg`` with model ``alias``'s decode graph compiled at B1 and B4, with the inactive-lane contract (a
    ``lane_valid`` mask that writes no KV, 000 §7.3): the package and that decode graph."""
    m = pkg.model(alias)
    dec = dataclasses.replace(
        m.decode,
        batch_profiles=(1, 4),
        inputs=(*m.decode.inputs, dataclasses.replace(m.decode.inputs[1], name="lane_valid", dtype="uint8")),
        inactive_lane_policy=InactiveLanePolicy(
            mask_input="lane_valid", writes_kv=False, returns_logits=False, kv_manager_mode="per_lane"
        ),
    )
    return dataclasses.replace(pkg, models=(dataclasses.replace(m, graphs=(m.prefill, dec)),)), dec


def stub_set_fault(rt: Runtime, name: str, value: int = 1) -> None:
    """Arm a fault switch through the calrt_ext.h test hook (the stub and the reference board export it)."""
    assert isinstance(rt, CalrtRuntime), rt
    fn = rt.library.fn.calrt_ext_fault_set
    assert fn(rt._dev, STUB_FAULT[name], value) == 0


@dataclass
class Backend:
    """One backend under the conformance suite: how to open it and how to arm a next-job fault."""

    name: str
    open: Callable[[], Runtime]

    def arm(self, rt: Runtime, fault: str) -> None:
        """Make the next submitted job hit ``fault``: busy | hang | ccu | dma."""
        if isinstance(rt, MockRuntime):
            kind = {
                "busy": FaultKind.DEVICE_BUSY,
                "hang": FaultKind.WAIT_TIMEOUT,
                "ccu": FaultKind.CCU_EXCEPTION,
                "dma": FaultKind.UNKNOWN_DMA_STATE,
            }[fault]
            rt.arm_fault(FaultRule(kind=kind, at=(1,)))
        else:
            stub_set_fault(rt, fault)


__all__ = ["Backend", "golden_prompt", "package", "prefill_job", "stub_set_fault", "write_decode", "write_prefill"]
