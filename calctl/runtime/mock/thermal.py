"""The mock board's per-chip telemetry: a first-order thermal model driven by the work on the device clock.

Each chip draws ``idle_w`` idle and up to ``max_w`` while its compute unit runs a job (the COMPUTE phases on the
device timeline, :mod:`.execution`: the modelled work, never the host's own time computing it), scaled by its
clock. Its temperature relaxes towards ``ambient_c + power x c_per_w`` with time constant ``tau_s``; the reported
power is averaged over ``power_tau_s`` (as a board reports it, docs/calrt-c-abi.md §15). At ``limit_c`` the chip
throttles: its clock drops to ``throttle_clock`` of the maximum (so compute phases last longer on the device
clock and it draws less) until it has cooled ``hysteresis_c`` below the limit. With the defaults a chip at full
load settles at 75 °C, under the 90 °C limit.

The telemetry faults (``faults.py``) act here: ``fan_failed`` multiplies ``c_per_w`` by its magnitude (default 4)
(the chip runs past its limit and throttles), ``stuck_sensor`` freezes the temperature reading where it was
(the model goes on underneath), ``ecc_errors`` adds to the ECC counters.

These are mock numbers, not a Calculet board's: nothing here is evidence about one (docs/runtime.md §5). This
module models and reads; it does not sleep, run jobs or decide faults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from calctl.errors import ConfigError


@dataclass(frozen=True)
class ThermalModel:
    """Per-chip thermal and power parameters of the mock board (the same as the reference board's, §15)."""

    ambient_c: float = 35.0
    c_per_w: float = 1.0  # degrees above ambient per watt, at steady state
    idle_w: float = 6.0
    max_w: float = 40.0
    tau_s: float = 10.0  # thermal time constant
    power_tau_s: float = 0.5  # the reported power's averaging
    limit_c: float = 90.0  # thermal throttling starts here
    hysteresis_c: float = 5.0
    power_limit_w: float = 45.0
    clock_mhz: float = 1000.0
    throttle_clock: float = 0.5  # the clock while throttled, as a fraction of clock_mhz

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"mock thermal model: {f.name} must be a finite number, got {value!r}")
        if not (self.tau_s > 0 and self.power_tau_s > 0 and 0 < self.throttle_clock <= 1 and self.max_w >= self.idle_w):
            raise ConfigError(
                "mock thermal model: tau_s and power_tau_s > 0, throttle_clock in (0, 1], max_w >= idle_w"
            )


class ChipThermal:
    """One chip's thermal state on the device clock. Not thread-safe: the board calls it under its lock."""

    def __init__(self, model: ThermalModel, now_ns: int) -> None:
        self.model = model
        self.power_w = model.idle_w
        self.temp_c = model.ambient_c + model.idle_w * model.c_per_w
        self.t_ns = now_ns
        self.throttled = False
        self.throttled_ns = 0
        self.ecc_correctable = 0
        self.ecc_uncorrectable = 0
        self.fan_factor = 1.0  # fan_failed: c_per_w times this (the fault's magnitude, default 4)
        self.stuck_c: float | None = None  # stuck_sensor: the frozen temperature reading
        self.busy_from_ns: int | None = None  # a compute phase in progress: its start

    @property
    def clock_factor(self) -> float:
        return self.model.throttle_clock if self.throttled else 1.0

    def advance(self, until_ns: int, *, busy: bool) -> None:
        """Run the model from its last time to ``until_ns``, the chip busy (computing) or idle all along."""
        if until_ns <= self.t_ns:
            return
        m = self.model
        dt = (until_ns - self.t_ns) / 1e9
        p = m.idle_w + (m.max_w - m.idle_w) * self.clock_factor if busy else m.idle_w
        c_per_w = m.c_per_w * self.fan_factor
        target = m.ambient_c + p * c_per_w
        self.temp_c = target + (self.temp_c - target) * math.exp(-dt / m.tau_s)
        self.power_w = p + (self.power_w - p) * math.exp(-dt / m.power_tau_s)
        if self.throttled:
            self.throttled_ns += until_ns - self.t_ns
        if self.temp_c >= m.limit_c:
            self.throttled = True
        elif self.temp_c < m.limit_c - m.hysteresis_c:
            self.throttled = False
        self.t_ns = until_ns

    def begin(self, start_ns: int) -> None:
        """A compute phase starts at ``start_ns`` (a reading before it ends counts the chip busy from there)."""
        self.busy_from_ns = start_ns

    def work(self, start_ns: int, end_ns: int) -> None:
        """A compute interval on the device clock: idle until its start, busy until its end (the part before the
        model's last time is already counted as idle; computes on one chip never overlap)."""
        self.busy_from_ns = None
        self.advance(start_ns, busy=False)
        self.advance(end_ns, busy=True)

    def reading(self, now_ns: int) -> dict[str, float | int | bool]:
        if self.busy_from_ns is not None:
            self.advance(self.busy_from_ns, busy=False)
        self.advance(now_ns, busy=self.busy_from_ns is not None)
        m = self.model
        return {
            "temperature_c": round(self.stuck_c if self.stuck_c is not None else self.temp_c, 2),
            "temperature_limit_c": m.limit_c,
            "power_w": round(self.power_w, 3),
            "power_limit_w": m.power_limit_w,
            "frequency_mhz": m.clock_mhz * self.clock_factor,
            "frequency_max_mhz": m.clock_mhz,
            "throttled": self.throttled,
            "throttled_s": self.throttled_ns / 1e9,
            "ecc_correctable": self.ecc_correctable,
            "ecc_uncorrectable": self.ecc_uncorrectable,
        }


__all__ = ["ChipThermal", "ThermalModel"]
