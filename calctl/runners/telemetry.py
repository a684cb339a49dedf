"""Per-chip telemetry sampled through a device run: :class:`TelemetrySampler` (docs/runners.md "Telemetry").

Every device a runner opens through :meth:`calctl.runners.device.DeviceSpec.open` gets a sampler that reads
``rt.telemetry()`` every ``interval_s`` (001 §14), from the process's one ticker thread, until the runtime closes
or :meth:`stop` is called.
Its memory is bounded: running aggregates per chip (average and maximum power, maximum temperature, time
throttled, the first and last ECC counters) over every sample, and at most ``keep`` samples for the pictures
(when full, every other one is dropped and the stride doubles, so the series still spans the whole run).
:func:`sampler_of` finds a runtime's sampler; :meth:`TelemetrySampler.document` is the ``telemetry`` block of a
report: per chip the figures, or null with "not reported by the runtime" where the runtime cannot tell (never 0).

This module samples and summarises; it judges nothing (``calctl burn-in`` grades against limits) and draws
nothing (:mod:`calctl.runners.telemetry_plot`).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from calctl.runtime import Runtime
from calctl.runtime.errors import RuntimeLayerError
from calctl.runtime.types import ChipTelemetry

DEFAULT_INTERVAL_S = 0.5
DEFAULT_KEEP = 600
NOT_REPORTED = "not reported by the runtime"
#: The per-sample fields a series keeps (what the pictures draw).
SERIES_FIELDS = ("temperature_c", "power_w", "frequency_mhz", "throttled")


@dataclass
class ChipAggregate:
    """Running figures of one chip over every sample of a run."""

    chip: int
    samples: int = 0
    power_sum: float = 0.0
    power_n: int = 0
    power_max: float | None = None
    power_min: float | None = None
    temperature_max: float | None = None
    temperature_min: float | None = None
    frequency_min: float | None = None
    throttled_first_s: float | None = None  # the runtime's throttled-time counter, first and last reading
    throttled_last_s: float | None = None
    throttled_samples_s: float = 0.0  # else: intervals whose sample said throttled
    throttled_seen: bool = False
    ecc: dict[str, tuple[int, int]] = field(default_factory=dict)  # counter -> (first, last)
    decreased: list[str] = field(default_factory=list)  # the first counters that went down (a broken runtime)
    decreases: int = 0
    temperatures: set[float] = field(default_factory=set)  # distinct readings, at most 64 kept
    limits: dict[str, float] = field(default_factory=dict)

    def add(self, t: ChipTelemetry, dt_s: float) -> None:
        self.samples += 1
        if t.power_w is not None:
            self.power_sum += t.power_w
            self.power_n += 1
            self.power_max = t.power_w if self.power_max is None else max(self.power_max, t.power_w)
            self.power_min = _min(self.power_min, t.power_w)
        if t.temperature_c is not None:
            self.temperature_max = _max(self.temperature_max, t.temperature_c)
            self.temperature_min = _min(self.temperature_min, t.temperature_c)
            if len(self.temperatures) < 64:
                self.temperatures.add(t.temperature_c)
        if t.frequency_mhz is not None:
            self.frequency_min = _min(self.frequency_min, t.frequency_mhz)
        if t.throttled_s is not None:
            if self.throttled_last_s is not None and t.throttled_s < self.throttled_last_s:
                self._decreased(f"throttled_s {self.throttled_last_s:g} -> {t.throttled_s:g}")
            self.throttled_first_s = t.throttled_s if self.throttled_first_s is None else self.throttled_first_s
            self.throttled_last_s = t.throttled_s
        if t.throttled is not None:
            self.throttled_seen = True
            if t.throttled:
                self.throttled_samples_s += dt_s
        for name in ("ecc_correctable", "ecc_uncorrectable"):
            v = getattr(t, name)
            if v is None:
                continue
            first, last = self.ecc.get(name, (v, v))
            if v < last:
                self._decreased(f"{name} {last} -> {v}")
            self.ecc[name] = (first, v)
        for name in ("temperature_limit_c", "power_limit_w"):
            v = getattr(t, name)
            if v is not None:
                self.limits[name] = v

    def _decreased(self, what: str) -> None:
        self.decreases += 1
        if len(self.decreased) < 10:  # the first few, named; a long run keeps a count, not a list
            self.decreased.append(what)

    @property
    def throttled_s(self) -> float | None:
        if self.throttled_first_s is not None and self.throttled_last_s is not None:
            return max(0.0, self.throttled_last_s - self.throttled_first_s)
        return self.throttled_samples_s if self.throttled_seen else None

    def document(self) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "power_w_avg": round(self.power_sum / self.power_n, 3) if self.power_n else None,
            "power_w_max": self.power_max,
            "temperature_c_max": self.temperature_max,
            "throttled_s": None if self.throttled_s is None else round(self.throttled_s, 3),
            "ecc_correctable_delta": _delta(self.ecc.get("ecc_correctable")),
            "ecc_uncorrectable_delta": _delta(self.ecc.get("ecc_uncorrectable")),
        }
        return {
            "chip": self.chip,
            "samples": self.samples,
            **figures,
            "not_reported": {k: NOT_REPORTED for k, v in figures.items() if v is None},
            "limits": dict(self.limits),
            "counters_decreased": list(self.decreased),
            "counter_decreases": self.decreases,
        }


def _delta(pair: tuple[int, int] | None) -> int | None:
    return None if pair is None else pair[1] - pair[0]


def _max(a: float | None, b: float) -> float:
    return b if a is None else max(a, b)


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


class TelemetrySampler:
    """Samples ``rt.telemetry()`` every ``interval_s`` (the ticker's thread); bounded memory (module docstring)."""

    def __init__(self, rt: Runtime, *, interval_s: float = DEFAULT_INTERVAL_S, keep: int = DEFAULT_KEEP) -> None:
        if not interval_s > 0 or keep < 2:
            raise ValueError(f"telemetry sampler: interval_s > 0 and keep >= 2, got {interval_s}, {keep}")
        self._runtime = weakref.ref(rt)
        self.interval_s = interval_s
        self.keep = keep
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0_ns = time.monotonic_ns()
        self._last_ns: int | None = None
        self._chips: dict[int, ChipAggregate] = {}
        self._series: list[tuple[float, tuple[ChipTelemetry, ...]]] = []
        self._stride = 1
        self._seen = 0
        self.errors = 0
        self.last_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> TelemetrySampler:
        """A first sample now, then one every ``interval_s`` from the process's one ticker thread (a thread per
        run would cost its start and join: tens of ms each on a loaded host)."""
        self.sample()
        _TICKER.add(self)
        return self

    def stop(self) -> None:
        """One last sample (while the device is still open), then no more. Idempotent."""
        if self._stop.is_set():
            return
        self.sample()
        self._stop.set()
        _TICKER.remove(self)

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def tick(self) -> bool:
        """The ticker's call: sample, or end (False) once stopped or the runtime is closed or gone."""
        rt = self._runtime()
        if self._stop.is_set() or rt is None or rt.closed:
            self._stop.set()
            return False
        self.sample()
        return True

    # -- sampling -------------------------------------------------------------------

    def sample(self) -> tuple[ChipTelemetry, ...] | None:
        """Read the telemetry once and fold it in; None when the runtime is gone or the read failed."""
        rt = self._runtime()
        if rt is None or rt.closed or self._stop.is_set():
            return None
        try:
            tel = rt.telemetry()
        except RuntimeLayerError as exc:
            with self._lock:
                self.errors += 1
                self.last_error = str(exc)
            return None
        now = time.monotonic_ns()
        with self._lock:
            dt = 0.0 if self._last_ns is None else (now - self._last_ns) / 1e9
            self._last_ns = now
            for t in tel:
                self._chips.setdefault(t.chip, ChipAggregate(t.chip)).add(t, dt)
            if self._seen % self._stride == 0:
                self._series.append(((now - self._t0_ns) / 1e9, tel))
                if len(self._series) >= self.keep:
                    self._series = self._series[::2]
                    self._stride *= 2
            self._seen += 1
        return tel

    # -- results --------------------------------------------------------------------

    def aggregates(self) -> dict[int, ChipAggregate]:
        with self._lock:
            return dict(self._chips)

    def series(self) -> list[tuple[float, tuple[ChipTelemetry, ...]]]:
        """The kept samples: (seconds since the sampler started, every chip's reading)."""
        with self._lock:
            return list(self._series)

    @property
    def t0_ns(self) -> int:
        return self._t0_ns

    def document(self, *, with_series: bool = False) -> dict[str, Any]:
        """The report's ``telemetry`` block (docs/runners.md "Telemetry")."""
        with self._lock:
            doc: dict[str, Any] = {
                "interval_s": self.interval_s,
                "samples": self._seen,
                "read_errors": self.errors,
                "chips": [self._chips[c].document() for c in sorted(self._chips)],
            }
            if self.last_error:
                doc["last_error"] = self.last_error
            if not self._chips:
                doc["note"] = f"no sample taken: {self.last_error or 'the device closed first'}"
            if with_series:
                doc["t0_monotonic_s"] = self._t0_ns / 1e9  # the series' t_s are seconds after this
                doc["series"] = [
                    {
                        "t_s": round(t, 3),
                        "chips": [{"chip": c.chip, **{f: getattr(c, f) for f in SERIES_FIELDS}} for c in tel],
                    }
                    for t, tel in self._series
                ]
        return doc


def telemetry_points(doc: Any) -> list[tuple[float, int, float | None, float | None]]:
    """A report's ``telemetry`` block (with its series) as (monotonic seconds, chip, °C, W) points for the
    trace picture; none when the block has no series."""
    if not isinstance(doc, dict) or not isinstance(doc.get("series"), list) or "t0_monotonic_s" not in doc:
        return []
    t0 = float(doc["t0_monotonic_s"])
    return [
        (t0 + float(s["t_s"]), int(c["chip"]), c.get("temperature_c"), c.get("power_w"))
        for s in doc["series"]
        for c in s["chips"]
    ]


class _Ticker:
    """One daemon thread per process that calls every running sampler's :meth:`TelemetrySampler.tick` when it is
    due; it starts with the first sampler and then waits, idle, for the next."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._due: dict[TelemetrySampler, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, sampler: TelemetrySampler) -> None:
        with self._cv:
            self._due[sampler] = time.monotonic() + sampler.interval_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="calctl-telemetry", daemon=True)
                self._thread.start()
            self._cv.notify()

    def remove(self, sampler: TelemetrySampler) -> None:
        with self._cv:
            self._due.pop(sampler, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._due:
                    self._cv.wait()
                sampler, when = min(self._due.items(), key=lambda kv: kv[1])
                delay = when - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)  # a new sampler may be due sooner: look again
                    continue
                self._due[sampler] = time.monotonic() + sampler.interval_s
            if not sampler.tick():  # outside the lock: a slow runtime delays the ticks, never a registration
                self.remove(sampler)


_TICKER = _Ticker()
_SAMPLERS: weakref.WeakKeyDictionary[Any, TelemetrySampler] = weakref.WeakKeyDictionary()
_SAMPLERS_LOCK = threading.Lock()
_RECENT: list[tuple[int, TelemetrySampler]] = []  # the last samplers started, with their ordinal (bounded)
_ORDINAL = [0]


def mark() -> int:
    """The ordinal of the next sampler: :func:`documents_since` a mark lists the devices a step opened."""
    with _SAMPLERS_LOCK:
        return _ORDINAL[0]


def documents_since(since: int) -> list[dict[str, Any]]:
    """The telemetry of every device opened since ``since`` (:func:`mark`), each stopped first."""
    with _SAMPLERS_LOCK:
        found = [s for n, s in _RECENT if n >= since]
    out = []
    for sampler in found:
        sampler.stop()
        out.append(sampler.document())
    return out


def attach_sampler(rt: Runtime, *, interval_s: float = DEFAULT_INTERVAL_S) -> TelemetrySampler:
    """Start sampling ``rt`` (the device a runner opened); :func:`sampler_of` finds it again."""
    sampler = TelemetrySampler(rt, interval_s=interval_s).start()
    with _SAMPLERS_LOCK:
        _SAMPLERS[rt] = sampler
        _RECENT.append((_ORDINAL[0], sampler))
        _ORDINAL[0] += 1
        del _RECENT[:-16]
    return sampler


def sampler_of(rt: Runtime | None) -> TelemetrySampler | None:
    if rt is None:
        return None
    with _SAMPLERS_LOCK:
        return _SAMPLERS.get(rt)


NOT_SAMPLED = {"note": "telemetry was not sampled on this run", "chips": []}


def telemetry_document(rt: Runtime | None, *, final: bool = True) -> dict[str, Any]:
    """``rt``'s sampler's document; ``final``: after a last sample, the sampler stopped (call it before the device
    closes where possible); else as it stands (a checkpoint of a run still going)."""
    sampler = sampler_of(rt)
    if sampler is None:
        return dict(NOT_SAMPLED)
    if final:
        sampler.stop()
    return sampler.document()


__all__ = [
    "DEFAULT_INTERVAL_S",
    "NOT_REPORTED",
    "ChipAggregate",
    "TelemetrySampler",
    "attach_sampler",
    "documents_since",
    "mark",
    "sampler_of",
    "telemetry_document",
    "telemetry_points",
]
