"""Turning the shared --device/--calrt-lib/--time-scale/--fault-plan options into a DeviceSpec, in one place."""

from __future__ import annotations

import os
from pathlib import Path

from calctl.cli._options import DeviceKind
from calctl.errors import UsageError
from calctl.runners.context import DeviceSpec
from calctl.runtime import DeviceKind as RuntimeDeviceKind


def device_spec(
    device: DeviceKind,
    calrt_lib: Path | None,
    time_scale: float | None = None,
    fault_plan: Path | None = None,
    seed: int | None = None,
    serialize_chips: bool = False,
) -> DeviceSpec:
    kind = RuntimeDeviceKind(device.value)
    lib = calrt_lib if kind is RuntimeDeviceKind.CALRT else None
    if kind is RuntimeDeviceKind.MOCK and calrt_lib is not None and str(calrt_lib) != os.environ.get("CALRT_LIBRARY"):
        raise UsageError("--calrt-lib applies to --device calrt only")
    if fault_plan is not None and not fault_plan.is_file():
        raise UsageError(f"--fault-plan {fault_plan}: no such file")
    return DeviceSpec(
        kind=kind,
        calrt_lib=lib,
        time_scale=time_scale,
        serialize_chips=serialize_chips,
        fault_plan=fault_plan,
        seed=seed,
    )
