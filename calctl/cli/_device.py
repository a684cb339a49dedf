"""Turning the shared options into run inputs, in one place: --device/--calrt-lib/--time-scale/--fault-plan/--seed
into a DeviceSpec, and --report DIR into a report directory (docs/cli.md, report directories)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from calctl.cli._options import DeviceKind
from calctl.errors import UsageError

if TYPE_CHECKING:
    from calctl.runners.device import DeviceSpec


def device_spec(
    device: DeviceKind,
    calrt_lib: Path | None,
    time_scale: float | None = None,
    fault_plan: Path | None = None,
    seed: int | None = None,
    serialize_chips: bool = False,
) -> DeviceSpec:
    from calctl.runners.device import DeviceSpec
    from calctl.runtime import DeviceKind as RuntimeDeviceKind

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


def report_dir(report: Path | None, command: str) -> Path:
    """``--report DIR``, else the documented default ``$CALCTL_REPORT_DIR`` or ``./calctl-reports``/COMMAND-STAMP."""
    from calctl.records import default_report_dir

    out = report if report is not None else default_report_dir(command)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--report {out}: exists and is not a directory")
    return out
