"""Helpers shared by the runtime tests (fixtures are in conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calctl.package.model import Package
from calctl.package.reader import load_manifest
from calctl.runtime import Job, Runtime
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.mock import FaultKind, FaultRule, MockRuntime
from calctl.runtime.types import KvSeqId

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ROOT / "fixtures" / "packages"
NATIVE = ROOT / "tests" / "native"
HEADERS = ROOT / "calctl" / "runtime" / "_native" / "reference"  # calrt.h, calrt_ext.h: shipped in the package

# calrt_ext_fault_set codes (calctl/runtime/_native/reference/calrt_ext.h)
STUB_FAULT = {"busy": 1, "hang": 2, "ccu": 3, "no_chip_memory": 4, "delay_ms": 5, "dma": 6, "no_chip_reset": 7}

_PACKAGE_CACHE: dict[str, Package] = {}


def package(kind: str) -> Package:
    """A fixture package (single | combined | replica), loaded once."""
    if kind not in _PACKAGE_CACHE:
        _PACKAGE_CACHE[kind] = load_manifest(PACKAGES / kind)
    return _PACKAGE_CACHE[kind]


def stub_set_fault(rt: Runtime, name: str, value: int = 1) -> None:
    """Arm a fault switch through the calrt_ext.h test hook (the stub and the reference board export it)."""
    fn = rt.library.fn.calrt_ext_fault_set  # type: ignore[attr-defined]
    assert fn(rt._dev, STUB_FAULT[name], value) == 0  # type: ignore[attr-defined]


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


def write_prefill(inputs: HostBuffer, prompt: np.ndarray) -> None:
    tokens = np.zeros(inputs.layout.slot("tokens").shape, np.int32)
    tokens[0, : len(prompt)] = prompt
    inputs.write("tokens", tokens)
    inputs.write("n_tokens", np.array([len(prompt)], np.int32))


def write_decode(inputs: HostBuffer, token: int, position: int) -> None:
    inputs.write("tokens", np.array([[token]], np.int32))
    inputs.write("positions", np.array([position], np.int32))


def golden_prompt(pkg: Package, alias: str) -> np.ndarray:
    m = pkg.model(alias)
    return np.load(pkg.root / m.golden.prompt.file).reshape(-1).astype(np.int32)


def prefill_job(
    rt: Runtime, pkg: Package, alias: str, prompt: np.ndarray | None = None, **submit: object
) -> tuple[Job, KvSeqId, HostBuffer, HostBuffer]:
    """Allocate a sequence and buffers, reserve, submit one prefill. Returns (job, seq, inputs, outputs)."""
    m = pkg.model(alias)
    prompt = golden_prompt(pkg, alias) if prompt is None else prompt
    seq = rt.kv.allocate(alias)
    inputs, outputs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
    write_prefill(inputs, prompt)
    rt.kv.append(seq, len(prompt))
    job = rt.submit(m.prefill.name, inputs, outputs, kv=[seq], **submit)  # type: ignore[arg-type]
    return job, seq, inputs, outputs
