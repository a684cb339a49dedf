"""Which device a runner opens, and how: :class:`DeviceSpec` (docs/runtime.md: fault plans, time scale, serialize chips)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.errors import UsageError
from calctl.runners.telemetry import attach_sampler
from calctl.runtime import DeviceKind, Runtime, open_runtime


@dataclass(frozen=True)
class DeviceSpec:
    """Which device to open and, for the mock, how (docs/runtime.md: fault plans, time_scale, serialize_chips)."""

    kind: DeviceKind = DeviceKind.MOCK
    calrt_lib: Path | None = None
    time_scale: float | None = None  # mock only; None = the mock's own default
    serialize_chips: bool = False  # mock only: a modelled global runtime lock (S1)
    fault_plan: Path | None = None  # mock only: calctl-fault-plan/v1 YAML
    seed: int | None = None  # mock only: overrides the fault plan's seed

    def __post_init__(self) -> None:
        if self.kind is DeviceKind.CALRT:
            given = [
                flag
                for flag, on in (
                    ("--time-scale", self.time_scale is not None),
                    ("--serialize-chips", self.serialize_chips),
                    ("--fault-plan", self.fault_plan is not None),
                    ("--seed", self.seed is not None),
                )
                if on
            ]
            if given:
                raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --device mock only")
        elif self.calrt_lib is not None:
            raise UsageError("--calrt-lib applies to --device calrt only")
        if self.time_scale is not None and not self.time_scale > 0:
            raise UsageError(f"--time-scale {self.time_scale}: expected a positive number")

    @property
    def is_mock(self) -> bool:
        return self.kind is DeviceKind.MOCK

    def with_default_time_scale(self, time_scale: float) -> DeviceSpec:
        """The same spec, with ``time_scale`` if the mock's is not set."""
        if not self.is_mock or self.time_scale is not None:
            return self
        return DeviceSpec(self.kind, self.calrt_lib, time_scale, self.serialize_chips, self.fault_plan, self.seed)

    def open(self, *, sample: bool = True) -> Runtime:
        """Open the device and (``sample``) start sampling its telemetry for the run's report
        (:mod:`calctl.runners.telemetry`: the one place every device run opens its board, so every run samples it)."""
        rt = self._open()
        if sample:
            attach_sampler(rt)
        return rt

    def _open(self) -> Runtime:
        if not self.is_mock:
            return open_runtime(self.kind, calrt_lib=self.calrt_lib)
        options: dict[str, Any] = {}
        if self.time_scale is not None:
            options["time_scale"] = self.time_scale
        if self.serialize_chips:
            options["serialize_chips"] = True
        if self.fault_plan is not None:
            options["fault_plan"] = self.fault_plan
        if self.seed is not None:
            options["seed"] = self.seed
        return open_runtime(self.kind, **options)

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind.value}
        if self.is_mock:
            doc.update(
                time_scale=self.time_scale if self.time_scale is not None else 1.0,
                serialize_chips=self.serialize_chips,
                fault_plan=str(self.fault_plan) if self.fault_plan else None,
                seed=self.seed,
            )
        else:
            doc["calrt_lib"] = str(self.calrt_lib) if self.calrt_lib else None
        return doc


__all__ = ["DeviceSpec"]
