"""Checks of the optional per-chip telemetry call ``calrt_chip_telemetry`` (docs/calrt-c-abi.md §15).

``telemetry_struct``: the sized struct (a size below version 1 refused, a chip past the board refused, the
version written, no byte past the caller's size written) and units that can be what §15 says they are (degrees
Celsius, watts, MHz; a limit above the reading's range; only defined throttle bits). ``telemetry_under_load``:
readings taken while both chips compute back to back: the counters never decrease, and temperature and power
change (a sensor that answers one value under load is frozen). A shim without the call: both UNSUPPORTED (C4),
never a pass. On the mock the same checks read ``rt.telemetry()``.

Each FAIL's detail starts with the clause it broke (TELEM-1 … TELEM-4).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import time
from typing import Any

from calctl.runtime import Runtime
from calctl.runtime.conformance.framework import (
    Abandoned,
    ConformanceLevel,
    Session,
    Unsupported,
    _unwrap,
    check,
    expect,
    prefill_job,
)
from calctl.runtime.errors import NotSupported, RuntimeStatus
from calctl.runtime.types import THROTTLE_REASONS

UNKNOWN_U64 = 2**64 - 1
CALRT_TELEMETRY_V1_SIZE = 104  # calrt_ext.h: the smallest struct a shim accepts
#: Plausible ranges of §15's units: what a chip can read, in the unit the ABI fixes (a reading outside is another
#: unit: milli-degrees, milliwatts, kHz or Hz; a compute clock whose maximum is below 50 MHz is in GHz).
RANGES = {
    "temperature_c": (-40.0, 150.0),
    "temperature_limit_c": (40.0, 150.0),
    "power_w": (0.0, 1000.0),
    "power_limit_w": (1.0, 1000.0),
    "clock_mhz": (0.0, 10000.0),
    "clock_max_mhz": (50.0, 10000.0),
}
COUNTERS = ("throttled_ns", "ecc_correctable", "ecc_uncorrectable", "reset_count")
STUCK_AFTER_S = 10.0
#: a thermal throttle reported this far below the chip's limit is not thermal (TELEM-2)
THERMAL_MARGIN_C = 20.0
_LOAD_S = {ConformanceLevel.QUICK: 1.5, ConformanceLevel.STANDARD: 3.0, ConformanceLevel.LONG: 5.0}


def _native_call(s: Session, rt: Runtime) -> Any:
    from calctl.runtime._native import lib as L

    raw = _unwrap(rt)
    if not raw.library.has(L.TELEMETRY_CALL):
        raise Unsupported(
            f"UNSUPPORTED (C4): {s.target.library} does not export {L.TELEMETRY_CALL} (optional, docs/calrt-c-abi.md "
            "§15): no per-chip temperature, power, clocks, throttle reasons or ECC"
        )
    return raw


def read(s: Session, rt: Runtime, chip: int, *, size: int | None = None) -> tuple[int, dict[str, Any]]:
    """One reading of ``chip``: (status, the fields as the runtime reported them: NaN / UNKNOWN_U64 kept)."""
    if not s.native:
        t = next(t for t in rt.telemetry() if t.chip == chip)
        nan = math.nan
        return 0, {
            "version": 1,
            "temperature_c": nan if t.temperature_c is None else t.temperature_c,
            "temperature_limit_c": nan if t.temperature_limit_c is None else t.temperature_limit_c,
            "power_w": nan if t.power_w is None else t.power_w,
            "power_limit_w": nan if t.power_limit_w is None else t.power_limit_w,
            "clock_mhz": nan if t.frequency_mhz is None else t.frequency_mhz,
            "clock_max_mhz": nan if t.frequency_max_mhz is None else t.frequency_max_mhz,
            "throttle_reasons": UNKNOWN_U64
            if t.throttle_reasons is None
            else sum(1 << THROTTLE_REASONS.index(r) for r in t.throttle_reasons if r in THROTTLE_REASONS),
            "throttled_ns": UNKNOWN_U64 if t.throttled_s is None else round(t.throttled_s * 1e9),
            "ecc_correctable": UNKNOWN_U64 if t.ecc_correctable is None else t.ecc_correctable,
            "ecc_uncorrectable": UNKNOWN_U64 if t.ecc_uncorrectable is None else t.ecc_uncorrectable,
            "reset_count": UNKNOWN_U64 if t.reset_count is None else t.reset_count,
        }
    from calctl.runtime._native import lib as L

    raw = _native_call(s, rt)
    out = L.CalrtTelemetry()
    out.size = ctypes.sizeof(L.CalrtTelemetry) if size is None else size
    rc = int(raw._fn.calrt_chip_telemetry(raw._dev, chip, ctypes.byref(out)))
    return rc, {f[0]: getattr(out, f[0]) for f in L.CalrtTelemetry._fields_}


def _ok_reading(s: Session, rt: Runtime, chip: int) -> dict[str, Any]:
    rc, r = read(s, rt, chip)
    expect(
        rc == RuntimeStatus.OK,
        f"TELEM-1: calrt_chip_telemetry of chip {chip} with a version-1 struct must answer OK",
        call="calrt_chip_telemetry",
        arguments=f"chip {chip}",
        returned=f"status {rc}",
    )
    return r


def _sample_time(chip: int, r: dict[str, Any], before: int, after: int) -> list[str]:
    """TELEM-2: ``sample_ns`` is CLOCK_MONOTONIC nanoseconds inside the call (0: unknown); the mock reports none."""
    stamp = r.get("sample_ns", 0)
    if stamp and not before <= stamp <= after:
        return [f"chip {chip} sample_ns {stamp} is not CLOCK_MONOTONIC ns within the call ({before}..{after})"]
    return []


def _units(chip: int, r: dict[str, Any]) -> list[str]:
    """Every field outside the plausible range of its unit (TELEM-2)."""
    bad = []
    for name, (lo, hi) in RANGES.items():
        v = r[name]
        if not math.isnan(v) and not lo <= v <= hi:
            bad.append(f"chip {chip} {name} {v:g} is outside [{lo:g}, {hi:g}]")
    clock, top = r["clock_mhz"], r["clock_max_mhz"]
    if not math.isnan(clock) and not math.isnan(top) and clock > top * 1.001:
        bad.append(f"chip {chip} clock_mhz {clock:g} is above clock_max_mhz {top:g}")
    reasons = r["throttle_reasons"]
    if reasons != UNKNOWN_U64 and reasons >> len(THROTTLE_REASONS):
        bad.append(f"chip {chip} throttle_reasons {reasons:#x} sets bits §15 does not define")
    return bad


def _larger_struct(raw: Any) -> None:
    """TELEM-1: a caller built against a later header passes a larger struct; the shim fills the version it
    knows, says so in ``size`` and ``version``, and answers OK (a later version only appends fields, §15)."""
    from calctl.runtime._native import lib as L

    v1 = ctypes.sizeof(L.CalrtTelemetry)
    buf = (ctypes.c_uint8 * (v1 + 64))()
    t = L.CalrtTelemetry.from_buffer(buf)
    t.size = v1 + 64
    rc = int(raw._fn.calrt_chip_telemetry(raw._dev, 0, ctypes.byref(t)))
    expect(
        rc == RuntimeStatus.OK and CALRT_TELEMETRY_V1_SIZE <= t.size <= v1 + 64 and t.version >= 1,
        f"TELEM-1: a caller's larger struct ({v1 + 64} bytes, a later header) must answer OK with the size and "
        "version the shim filled",
        call="calrt_chip_telemetry",
        arguments=f"chip 0, size {v1 + 64}",
        returned=f"status {rc}, size {t.size}, version {t.version}",
    )


@check(
    "telemetry_struct",
    "calrt_chip_telemetry honours the sized struct and reports in §15's units",
    clauses=("TELEM-1", "TELEM-2"),
)
def _telemetry_struct(s: Session) -> str:
    with s.open() as rt:
        chips = rt.topology().chips
        if s.native:
            from calctl.runtime._native import lib as L

            raw = _native_call(s, rt)
            rc, _ = read(s, rt, 0, size=16)
            expect(
                rc == RuntimeStatus.INVALID_ARGUMENT,
                "TELEM-1: a size below version 1's (16 < 104 bytes) must be INVALID_ARGUMENT",
                call="calrt_chip_telemetry",
                arguments="chip 0, size 16",
                returned=f"status {rc}",
            )
            rc, _ = read(s, rt, chips)
            expect(
                rc == RuntimeStatus.INVALID_ARGUMENT,
                f"TELEM-1: chip {chips} (past the board's {chips}) must be INVALID_ARGUMENT",
                call="calrt_chip_telemetry",
                arguments=f"chip {chips}",
                returned=f"status {rc}",
            )
            # a struct with a guard after it: the callee writes no byte past the size it was given
            buf = (ctypes.c_uint8 * (ctypes.sizeof(L.CalrtTelemetry) + 64))(
                *([0xA5] * (ctypes.sizeof(L.CalrtTelemetry) + 64))
            )
            t = L.CalrtTelemetry.from_buffer(buf)
            t.size = ctypes.sizeof(L.CalrtTelemetry)
            rc = int(raw._fn.calrt_chip_telemetry(raw._dev, 0, ctypes.byref(t)))
            guard = bytes(buf[ctypes.sizeof(L.CalrtTelemetry) :])
            expect(
                rc == RuntimeStatus.OK and set(guard) == {0xA5},
                "TELEM-1: with size 104 the call answers OK and writes nothing past the struct",
                call="calrt_chip_telemetry",
                arguments="chip 0, size 104",
                returned=f"status {rc}, guard {'intact' if set(guard) == {0xA5} else 'overwritten'}",
            )
            _larger_struct(raw)
        bad: list[str] = []
        seen = []
        for c in range(chips):
            before = time.monotonic_ns()
            r = _ok_reading(s, rt, c)
            bad += _sample_time(c, r, before, time.monotonic_ns())
            expect(
                r["version"] >= 1,
                f"TELEM-1: chip {c}: version must be 1 or more",
                call="calrt_chip_telemetry",
                returned=f"version {r['version']}",
            )
            bad += _units(c, r)
            seen.append(r)
        s.evidence["readings"] = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in seen
        ]
        expect(
            not bad,
            "TELEM-2: units are degrees Celsius, watts and MHz (docs/calrt-c-abi.md §15): " + "; ".join(bad[:4]),
            call="calrt_chip_telemetry",
            returned="; ".join(bad[:4]),
        )
        reported = [k for k in RANGES if not all(math.isnan(r[k]) for r in seen)]
    return f"{chips} chips; reported: {', '.join(reported) or 'none'}; every value in its unit's range"


@check(
    "telemetry_under_load",
    "under load the counters never decrease, temperature and power change (no frozen sensor), and a thermal "
    "throttle is reported only near the limit",
    clauses=("TELEM-2", "TELEM-3", "TELEM-4"),
    seconds={ConformanceLevel.STANDARD: 60.0, ConformanceLevel.LONG: 90.0},
)
def _telemetry_under_load(s: Session) -> str:
    with s.configured() as rt:
        chips = rt.topology().chips
        for c in range(chips):
            _ok_reading(s, rt, c)  # UNSUPPORTED on a shim without the call, before any load
        readings, done, errors = _readings_under_load(s, rt, chips)
    expect(not errors and done > 0, f"the load ran no job: {'; '.join(errors[:2])}", call="load")
    s.evidence.update(jobs=done, readings=sum(len(r) for r in readings))
    decreased = [d for c, rs in enumerate(readings) for d in _decreases(c, rs)]
    expect(
        not decreased,
        "TELEM-3: throttled_ns, ecc_* and reset_count never decrease: " + "; ".join(decreased[:4]),
        call="calrt_chip_telemetry",
        returned="; ".join(decreased[:4]),
    )
    frozen = [f for c, rs in enumerate(readings) for f in _frozen(c, rs)]
    expect(
        not frozen,
        f"TELEM-4: under load ({done} jobs over {_LOAD_S[s.level]:g} s) a sensor that never changes is frozen: "
        + "; ".join(frozen[:4]),
        call="calrt_chip_telemetry",
        returned="; ".join(frozen[:4]),
    )
    cold = [t for c, rs in enumerate(readings) for t in _cold_throttle(c, rs)]
    expect(
        not cold,
        f"TELEM-2: the thermal throttle bit means the chip reached temperature_limit_c; reported more than "
        f"{THERMAL_MARGIN_C:g} C below it: " + "; ".join(cold[:4]),
        call="calrt_chip_telemetry",
        returned="; ".join(cold[:4]),
    )
    rises = [
        f"chip {c} {rs[0]['temperature_c']:.2f} -> {max(r['temperature_c'] for r in rs):.2f} C"
        for c, rs in enumerate(readings)
        if not math.isnan(rs[0]["temperature_c"])
    ]
    return f"{done} jobs, {sum(len(r) for r in readings)} readings; counters monotonic; {'; '.join(rises)}"


def _readings_under_load(s: Session, rt: Runtime, chips: int) -> tuple[list[list[dict[str, Any]]], int, list[str]]:
    """Every chip read every 100 ms while one thread per model computes back to back: (readings per chip, jobs
    done, the load's errors)."""
    stop = threading.Event()
    done = [0]
    errors: list[str] = []

    def load(alias: str) -> None:
        while not stop.is_set():
            try:
                job, seq, inputs, outputs = prefill_job(rt, s.package, alias)
                rt.wait(job, 30.0)
                rt.kv.free(seq)
                rt.release_buffer(inputs)
                rt.release_buffer(outputs)
                done[0] += 1
            except Exception as exc:  # the load is the means, not the finding: say it and stop
                errors.append(f"{alias}: {type(exc).__name__}: {exc}")
                return

    threads = [threading.Thread(target=load, args=(a,), name=f"load {a}", daemon=True) for a in s.package.aliases]
    readings: list[list[dict[str, Any]]] = [[_ok_reading(s, rt, c)] for c in range(chips)]
    for t in threads:
        t.start()
    until = time.monotonic() + _LOAD_S[s.level]
    while time.monotonic() < until and not errors:
        time.sleep(0.1)
        for c in range(chips):
            readings[c].append(_ok_reading(s, rt, c))
    stop.set()
    for t in threads:
        t.join(STUCK_AFTER_S)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:  # inside the library for good: the process cannot close the device
        raise Abandoned(
            f"the load's threads ({', '.join(stuck)}) made no progress for {STUCK_AFTER_S:g} s after the load "
            "ended (a deadlock in the shim; the remaining checks run in a fresh process)",
            call="rt.submit / rt.wait from one thread per model",
            returned="never returned",
        )
    return readings, done[0], errors


def _decreases(chip: int, rs: list[dict[str, Any]]) -> list[str]:
    """TELEM-3: the first decrease of each known counter over the readings of ``chip``."""
    out = []
    for name in COUNTERS:
        values = [r[name] for r in rs if r[name] != UNKNOWN_U64]
        out += [f"chip {chip} {name} {a} -> {b}" for a, b in itertools.pairwise(values) if b < a][:1]
    return out


def _frozen(chip: int, rs: list[dict[str, Any]]) -> list[str]:
    """TELEM-4: a power or temperature sensor that read one value in every reading under load."""
    out = []
    watts = [r["power_w"] for r in rs if not math.isnan(r["power_w"])]
    temps = [r["temperature_c"] for r in rs if not math.isnan(r["temperature_c"])]
    if len(watts) >= 3 and len(set(watts)) == 1:
        out.append(f"chip {chip} power_w read {watts[0]:g} in all {len(watts)} readings")
    # A temperature is frozen when it never moved while the chip's power did (by 1 W or more: at 1 C/W that
    # is over 0.1 C within the load), so a host too busy to load the chip never fails a working sensor.
    drew = len(set(watts)) > 1 and max(watts) - min(watts) >= 1.0
    if len(temps) >= 3 and len(set(temps)) == 1 and (drew or len(set(watts)) <= 1):
        out.append(f"chip {chip} temperature_c read {temps[0]:g} in all {len(temps)} readings")
    return out


def _cold_throttle(chip: int, rs: list[dict[str, Any]]) -> list[str]:
    """TELEM-2: the thermal bit (0x1) set while the chip reads more than THERMAL_MARGIN_C below its limit (a
    hysteresis keeps a real throttle on a few degrees below the limit, never tens)."""
    for r in rs:
        reasons, temp, limit = r["throttle_reasons"], r["temperature_c"], r["temperature_limit_c"]
        if reasons == UNKNOWN_U64 or not reasons & 1 or math.isnan(temp) or math.isnan(limit):
            continue
        if temp < limit - THERMAL_MARGIN_C:
            return [f"chip {chip} throttle_reasons {reasons:#x} (thermal) at {temp:.1f} C, limit {limit:g} C"]
    return []


@check(
    "telemetry_across_resets",
    "the telemetry counters survive a chip and a board reset, and a reported reset_count counts both",
    clauses=("TELEM-3", "TELEM-5"),
)
def _telemetry_across_resets(s: Session) -> str:
    """Every chip read before, after a reset of chip 0 (where the shim has chip scope) and after a board reset:
    the counters count since power-on (§15), so none may go down, and a known ``reset_count`` grows by at least
    the resets that covered the chip."""
    with s.open() as rt:
        chips = rt.topology().chips
        steps: list[tuple[str, set[int]]] = [("before", set())]
        rounds = [[_ok_reading(s, rt, c) for c in range(chips)]]
        try:
            rt.reset("chip", chip=0)
            steps.append(("after a reset of chip 0", {0}))
            rounds.append([_ok_reading(s, rt, c) for c in range(chips)])
        except NotSupported:
            pass
        rt.reset("board")
        steps.append(("after a board reset", set(range(chips))))
        rounds.append([_ok_reading(s, rt, c) for c in range(chips)])
    bad = []
    for c in range(chips):
        bad += _decreases(c, [rs[c] for rs in rounds])
        for (when, covered), prev, now in zip(steps[1:], rounds[:-1], rounds[1:], strict=True):
            a, b = prev[c]["reset_count"], now[c]["reset_count"]
            if c in covered and UNKNOWN_U64 not in (a, b) and b <= a:
                bad.append(f"chip {c} reset_count {a} -> {b} {when}")
    expect(
        not bad,
        "TELEM-3, TELEM-5: counters count since power-on, and reset_count every reset covering the chip: "
        + "; ".join(bad[:4]),
        call="calrt_chip_telemetry / calrt_reset",
        returned="; ".join(bad[:4]),
    )
    known = [c for c in range(chips) if rounds[-1][c]["reset_count"] != UNKNOWN_U64]
    return f"{len(steps) - 1} resets; counters never decreased; reset_count reported on chips {known or 'none'}"


#: how long one chip computes alone for ``telemetry_attribution``
ATTRIBUTION_S = 1.0
#: a rise in power (W) below which nothing is judged (a host too loaded to keep the chip busy)
ATTRIBUTION_MIN_RISE_W = 1.0


@check(
    "telemetry_attribution",
    "while one chip computes alone, its own power reading rises, not the idle chip's",
    clauses=("TELEM-6",),
)
def _telemetry_attribution(s: Session) -> str:
    """One model's jobs back to back for ``ATTRIBUTION_S`` s, the other chip idle: the idle chip's ``power_w`` must
    rise less than half as much as the busy chip's (a shim that numbers the sensors the other way round shows the
    idle chip heating; one that reports the board's power rail for every chip shows both rising alike). When
    neither rises by ``ATTRIBUTION_MIN_RISE_W`` (a host too loaded to keep the chip busy) the check says so and
    judges nothing."""
    a, b = s.pair()
    busy, idle = s.chip_of(a), s.chip_of(b)
    with s.configured() as rt:
        before = {c: _ok_reading(s, rt, c)["power_w"] for c in (busy, idle)}
        if any(math.isnan(w) for w in before.values()):
            return "power not reported (NaN): nothing to attribute"
        jobs, until = 0, time.monotonic() + ATTRIBUTION_S
        while time.monotonic() < until:
            job, seq, inputs, outputs = prefill_job(rt, s.package, a)
            rt.wait(job, 30.0)
            rt.kv.free(seq)
            rt.release_buffer(inputs)
            rt.release_buffer(outputs)
            jobs += 1
        after = {c: _ok_reading(s, rt, c)["power_w"] for c in (busy, idle)}
    rise = {c: after[c] - before[c] for c in (busy, idle)}
    s.evidence.update(jobs=jobs, rise_w={str(c): round(r, 2) for c, r in rise.items()})
    figures = f"chip {busy} (busy, {jobs} jobs of {a}) {before[busy]:.1f} -> {after[busy]:.1f} W, chip {idle} (idle) "
    figures += f"{before[idle]:.1f} -> {after[idle]:.1f} W"
    expect(
        rise[idle] <= max(rise[busy], 0.0) / 2 + ATTRIBUTION_MIN_RISE_W,
        f"TELEM-6: while chip {busy} computed alone, chip {idle}'s power rose at least half as much as its own: the "
        f"readings are not the chip asked for (another chip's, or the board's) ({figures})",
        call="calrt_chip_telemetry",
        arguments=f"chips {busy} and {idle}",
        returned=figures,
    )
    if max(rise.values()) < ATTRIBUTION_MIN_RISE_W:
        return f"not judged: no chip's power rose {ATTRIBUTION_MIN_RISE_W:g} W ({figures})"
    return figures
