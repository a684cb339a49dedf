"""Per-chip telemetry through the optional C ABI call ``calrt_chip_telemetry`` (docs/calrt-c-abi.md §15).

:func:`chip_telemetry` turns one ``calrt_telemetry`` struct into a :class:`ChipTelemetry`: NaN doubles and
``CALRT_UNKNOWN_U64`` integers become None with a vendor gap, never 0; units are the ABI's (degrees Celsius,
watts, MHz; nanoseconds become seconds). :func:`new_struct` is a struct with its ``size`` set, as the call
expects. A shim without the call is the caller's business (``CalrtRuntime.telemetry`` reports every field null
with a vendor gap). This module converts; it judges nothing (conformance and burn-in do).
"""

from __future__ import annotations

import math

from calctl.runtime._native import lib as L
from calctl.runtime.types import ChipTelemetry, telemetry_gaps, throttle_reason_names

UNKNOWN_U64 = 2**64 - 1


def new_struct() -> L.CalrtTelemetry:
    t = L.CalrtTelemetry()
    t.size = L.ctypes.sizeof(L.CalrtTelemetry)
    return t


def _f(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _u(value: int) -> int | None:
    return None if value == UNKNOWN_U64 else int(value)


def chip_telemetry(chip: int, t: L.CalrtTelemetry, queue_depth: int | None) -> ChipTelemetry:
    """``t`` as calctl's per-chip telemetry; what the runtime did not report is None and listed as a gap."""
    reasons = _u(t.throttle_reasons)
    throttled_ns = _u(t.throttled_ns)
    return telemetry_gaps(
        ChipTelemetry(
            chip=chip,
            temperature_c=_f(t.temperature_c),
            power_w=_f(t.power_w),
            frequency_mhz=_f(t.clock_mhz),
            throttled=None if reasons is None else reasons != 0,
            reset_count=_u(t.reset_count),
            queue_depth=queue_depth,
            temperature_limit_c=_f(t.temperature_limit_c),
            power_limit_w=_f(t.power_limit_w),
            frequency_max_mhz=_f(t.clock_max_mhz),
            throttle_reasons=None if reasons is None else throttle_reason_names(reasons),
            throttled_s=None if throttled_ns is None else throttled_ns / 1e9,
            ecc_correctable=_u(t.ecc_correctable),
            ecc_uncorrectable=_u(t.ecc_uncorrectable),
            sample_ns=_u(t.sample_ns) or None,
        ),
        "calrt_chip_telemetry does not report it on this shim (vendor gap, 001 §15)",
    )


__all__ = ["UNKNOWN_U64", "chip_telemetry", "new_struct"]
