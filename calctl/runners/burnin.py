"""``calctl burn-in``: both chips at sustained maximum load, their telemetry graded against limits (docs/burn-in.md).

The board is opened and configured through :class:`~calctl.runners.context.RunContext` with the bundled combined
sample (model A on chip 0, model B on chip 1, as ``device check``), then for ``minutes`` each chip runs back to
back prefill jobs from two threads at once (engines PING and PONG: two in flight per chip, 000 §14), both chips
together. The device's telemetry is sampled every ``interval_s`` (:mod:`calctl.runners.telemetry`). Each chip is
then graded, one row per figure (001 §14, docs/calrt-c-abi.md §15):

* ``temperature``: the hottest reading against ``temperature_c_max`` (default: the runtime's own
  ``temperature_limit_c``, where it throttles);
* ``power``: the highest reading against ``power_w_max`` (default: the runtime's ``power_limit_w``);
* ``throttle``: seconds spent throttled against ``throttled_s_max`` (default 0), with the reasons seen;
* ``ecc correctable`` / ``ecc uncorrectable``: the counters' growth against ``ecc_correctable_max`` (default 0)
  and 0;
* ``sensor``: a temperature that reads one value through the whole load is a frozen sensor, and a counter that
  decreased is a broken one;
* ``jobs``: every job completed (a failed job or a chip that went down fails the chip).

PASS within the limit; WARN within ``warn_fraction`` (default 5 %) of it; FAIL past it, naming the figure, the
chip and the limit; NOT JUDGED where the runtime does not report the figure or no limit is known (never a
pass, never a FAIL). The verdict is the worst row; NOT JUDGED rows make a PASS a WARN. Limits come from the
board profile's ``telemetry`` block (``calculet-board-profile/v1``, the file ``device selftest`` reads), else
the defaults above, and the report states which.

This module loads the board and judges; it does not parse options or render (the CLI does), and draws through
:mod:`calctl.runners.telemetry_plot`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.report import Report
from calctl.runners.board_check import known_answer_package
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Run, RunState, RunStep, drive
from calctl.runners.steps import StepLog, StepNote
from calctl.runners.telemetry import NOT_REPORTED, ChipAggregate, TelemetrySampler
from calctl.runtime import Engine, Runtime
from calctl.runtime.errors import RuntimeLayerError

DEFAULT_WARN_FRACTION = 0.05


@dataclass(frozen=True)
class BurnInLimits:
    """Per-chip limits; None: the runtime's own limit (temperature, power), else NOT JUDGED."""

    temperature_c_max: float | None = None
    power_w_max: float | None = None
    throttled_s_max: float = 0.0
    ecc_correctable_max: int = 0
    ecc_uncorrectable_max: int = 0
    warn_fraction: float = DEFAULT_WARN_FRACTION
    source: str = "defaults (docs/burn-in.md)"

    @classmethod
    def from_profile(cls, path: Path) -> BurnInLimits:
        """The ``telemetry`` block of a ``calculet-board-profile/v1`` (ConfigError, exit 2, names the field)."""
        from calctl.runners.selftest import BoardProfile

        t = BoardProfile.load(path).telemetry
        return cls(
            temperature_c_max=t.get("temperature_c_max"),
            power_w_max=t.get("power_w_max"),
            throttled_s_max=t.get("throttled_s_max", 0.0),
            ecc_correctable_max=int(t.get("ecc_correctable_max", 0)),
            ecc_uncorrectable_max=int(t.get("ecc_uncorrectable_max", 0)),
            warn_fraction=t.get("warn_fraction", DEFAULT_WARN_FRACTION),
            source=f"board profile {path}" + ("" if t else " (no telemetry block: defaults)"),
        )

    def document(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "temperature_c_max": self.temperature_c_max if self.temperature_c_max is not None else "runtime's limit",
            "power_w_max": self.power_w_max if self.power_w_max is not None else "runtime's limit",
            "throttled_s_max": self.throttled_s_max,
            "ecc_correctable_max": self.ecc_correctable_max,
            "ecc_uncorrectable_max": self.ecc_uncorrectable_max,
            "warn_fraction": self.warn_fraction,
        }


@dataclass(frozen=True)
class BurnInRow:
    """One graded figure of one chip."""

    chip: int
    figure: str
    status: str  # PASS | WARN | FAIL | NOT JUDGED
    value: float | None
    limit: float | None
    detail: str

    def document(self) -> dict[str, Any]:
        return {
            "chip": self.chip,
            "figure": self.figure,
            "status": self.status,
            "value": self.value,
            "limit": self.limit,
            "detail": self.detail,
        }


@dataclass
class BurnInChipLoad:
    """What the load did on one chip."""

    chip: int
    model: str
    jobs: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_burnin(
    device: DeviceSpec,
    *,
    minutes: float,
    limits: BurnInLimits,
    interval_s: float = 1.0,
    log: StepLog | None = None,
    progress: Callable[[str], None] = lambda line: None,
    plot: Path | None = None,
) -> Report:
    """Load both chips for ``minutes``, sample telemetry, grade (module docstring)."""
    from calctl.signing.policy import make_policy

    loads: list[BurnInChipLoad] = []

    def full_load(s: RunState, note: StepNote) -> None:
        assert s.ctx is not None and s.ctx.calbin is not None and s.ctx.pkg is not None
        if s.ctx.sampler is not None:
            s.ctx.sampler.interval_s = interval_s
        loads.extend(BurnInChipLoad(mp.chips[0], alias) for alias, mp in s.ctx.calbin.plan.models.items())
        _load(s.rt, s.ctx.pkg, loads, minutes * 60.0, s.ctx.sampler, progress)
        note.detail = "; ".join(f"chip {ld.chip} ({ld.model}): {ld.jobs} jobs" for ld in loads)

    def report(s: RunState, ended: Ended) -> Report:
        assert s.ctx is not None
        sampler = s.ctx.sampler
        aggregates = sampler.aggregates() if sampler is not None else {}
        rows = grade(aggregates, loads, limits) if not ended.stopped else []
        verdict = ended.outcome.value if ended.stopped else _verdict(rows)
        failing = [r for r in rows if r.status == "FAIL"]
        error = ended.error
        if error is None and failing:
            error = "; ".join(f"chip {r.chip} {r.figure}: {r.detail}" for r in failing[:4])
        pictures: dict[str, str] = {}
        if plot is not None and sampler is not None:
            from calctl.runners.telemetry_plot import plot_telemetry

            title = f"calctl burn-in ({minutes:g} min)"
            plot_telemetry(plot, sampler.series(), device=device.kind.value, title=title, limits=_plot_limits(rows))
            pictures["plot"] = str(plot)
        body: dict[str, Any] = {
            "minutes": minutes,
            "interval_s": interval_s,
            "limits": limits.document(),
            "rows": [r.document() for r in rows],
            "chips": [
                {"chip": ld.chip, "model": ld.model, "jobs": ld.jobs, "failed": ld.failed, "errors": ld.errors[:5]}
                for ld in loads
            ],
            "telemetry": sampler.document(with_series=True) if sampler is not None else None,
        }
        reasons = [f"chip {r.chip} {r.figure}: {r.detail}" for r in rows if r.status in ("FAIL", "WARN")]
        return s.report(verdict, body, error=error, reasons=reasons, pictures=pictures)

    # The load is the bundled sample's, signed by the published test-only key: trusted for this.
    trust = make_policy(None, False, trust_test_key=True)
    run = Run("burn-in", device, [RunStep("full load", full_load)], report, package=known_answer_package(), trust=trust)
    return drive(run, log=log)


def _load(
    rt: Runtime,
    pkg: Any,
    loads: list[BurnInChipLoad],
    seconds: float,
    sampler: TelemetrySampler | None,
    progress: Callable[[str], None],
) -> None:
    """Back-to-back prefill jobs on every chip at once, two in flight per chip (PING and PONG)."""
    stop = threading.Event()
    deadline = time.monotonic() + seconds

    def worker(ld: BurnInChipLoad, engine: Engine) -> None:
        graph = pkg.model(ld.model).prefill
        prompt = _prompt(pkg, ld.model)
        inputs, outputs = rt.alloc_inputs(graph.name), rt.alloc_outputs(graph.name)
        try:
            _write_prompt(inputs, prompt)
            while not stop.is_set() and time.monotonic() < deadline:
                seq = rt.kv.allocate(ld.model)
                try:
                    rt.kv.append(seq, len(prompt))
                    result = rt.wait(rt.submit(graph.name, inputs, outputs, engine, kv=[seq]), 60.0)
                finally:
                    rt.kv.free(seq)
                with ld.lock:
                    if result.state.value == "succeeded":
                        ld.jobs += 1
                    else:
                        ld.failed += 1
                        ld.errors.append(f"job {result.job.id}: {result.state.value} {result.detail or ''}".strip())
                        return
        except RuntimeLayerError as exc:
            with ld.lock:
                ld.failed += 1
                ld.errors.append(f"{type(exc).__name__}: {exc.message}")
        finally:
            for buf in (inputs, outputs):
                with contextlib.suppress(RuntimeLayerError):  # held by a job: the teardown's reset reclaims it
                    rt.release_buffer(buf)

    threads = [
        threading.Thread(target=worker, args=(ld, e), name=f"burn-in-chip{ld.chip}-{e.value}", daemon=True)
        for ld in loads
        for e in (Engine.PING, Engine.PONG)
    ]
    for t in threads:
        t.start()
    try:
        next_line = time.monotonic() + 10.0
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            if time.monotonic() >= next_line:
                next_line += 10.0
                progress(_progress_line(loads, sampler, deadline))
    finally:
        stop.set()
        for t in threads:
            t.join(120)


def _progress_line(loads: list[BurnInChipLoad], sampler: TelemetrySampler | None, deadline: float) -> str:
    aggs = sampler.aggregates() if sampler is not None else {}
    parts = []
    for ld in loads:
        a = aggs.get(ld.chip)
        t = "n/a" if a is None or a.temperature_max is None else f"max {a.temperature_max:.1f} C"
        p = "n/a" if a is None or a.power_max is None else f"max {a.power_max:.1f} W"
        parts.append(f"chip {ld.chip}: {ld.jobs} jobs, {t}, {p}")
    return f"burn-in: {max(0.0, deadline - time.monotonic()):.0f} s left; " + "; ".join(parts)


def _prompt(pkg: Any, alias: str) -> Any:
    from calctl.runtime.conformance import golden_prompt

    return golden_prompt(pkg, alias)


def _write_prompt(inputs: Any, prompt: Any) -> None:
    from calctl.runtime.conformance import write_prefill

    write_prefill(inputs, prompt)


# -- grading ----------------------------------------------------------------------------------------------------


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _against(value: float | None, limit: float | None, warn: float, figure: str, unit: str) -> tuple[str, str]:
    value = _r(value)
    if value is None:
        return "NOT JUDGED", f"{figure}: {NOT_REPORTED}"
    if limit is None:
        return "NOT JUDGED", f"{value:g} {unit}: no limit (none in the profile, none reported by the runtime)"
    if value > limit:
        return "FAIL", f"{value:g} {unit} is over the limit {limit:g} {unit}"
    if value >= limit * (1 - warn):
        return "WARN", f"{value:g} {unit} is within {warn:.0%} of the limit {limit:g} {unit}"
    return "PASS", f"{value:g} {unit} (limit {limit:g} {unit})"


def grade(aggregates: dict[int, ChipAggregate], loads: list[BurnInChipLoad], limits: BurnInLimits) -> list[BurnInRow]:
    """Every chip's rows (module docstring). A chip the sampler never saw gets NOT JUDGED telemetry rows."""
    rows: list[BurnInRow] = []
    w = limits.warn_fraction
    for ld in loads:
        c = ld.chip
        a = aggregates.get(c) or ChipAggregate(c)
        t_limit = (
            limits.temperature_c_max if limits.temperature_c_max is not None else a.limits.get("temperature_limit_c")
        )
        status, detail = _against(a.temperature_max, t_limit, w, "temperature", "C")
        rows.append(BurnInRow(c, "temperature", status, _r(a.temperature_max), t_limit, detail))
        p_limit = limits.power_w_max if limits.power_w_max is not None else a.limits.get("power_limit_w")
        status, detail = _against(a.power_max, p_limit, w, "power", "W")
        rows.append(BurnInRow(c, "power", status, _r(a.power_max), p_limit, detail))
        throttled = a.throttled_s
        if throttled is None:
            rows.append(
                BurnInRow(c, "throttle", "NOT JUDGED", None, limits.throttled_s_max, f"throttle: {NOT_REPORTED}")
            )
        else:
            bad = throttled > limits.throttled_s_max
            low = f"; clock down to {a.frequency_min:g} MHz" if a.frequency_min is not None else ""
            rows.append(
                BurnInRow(
                    c,
                    "throttle",
                    "FAIL" if bad else "PASS",
                    round(throttled, 3),
                    limits.throttled_s_max,
                    f"throttled {throttled:.1f} s (limit {limits.throttled_s_max:g} s){low if bad else ''}",
                )
            )
        for name, limit in (
            ("ecc_correctable", limits.ecc_correctable_max),
            ("ecc_uncorrectable", limits.ecc_uncorrectable_max),
        ):
            figure = name.replace("_", " ")
            pair = a.ecc.get(name)
            if pair is None:
                rows.append(BurnInRow(c, figure, "NOT JUDGED", None, limit, f"{figure}: {NOT_REPORTED}"))
                continue
            delta = pair[1] - pair[0]
            status = "FAIL" if delta > limit else "PASS"
            rows.append(
                BurnInRow(c, figure, status, delta, limit, f"{delta} new error(s) during the burn-in (limit {limit})")
            )
        rows.append(_sensor_row(a))
        ok = ld.jobs > 0 and ld.failed == 0
        detail = f"{ld.jobs} jobs completed" + (
            f", {ld.failed} failed: {'; '.join(ld.errors[:2])}" if ld.failed else ""
        )
        rows.append(
            BurnInRow(c, "jobs", "PASS" if ok else "FAIL", ld.jobs, None, detail if ld.jobs else detail + " (none)")
        )
    return rows


def _sensor_row(a: ChipAggregate) -> BurnInRow:
    if a.decreased:
        return BurnInRow(a.chip, "sensor", "FAIL", None, None, "a counter decreased: " + "; ".join(a.decreased[:3]))
    if a.temperature_max is None:
        return BurnInRow(a.chip, "sensor", "NOT JUDGED", None, None, f"temperature: {NOT_REPORTED}")
    # frozen: one reading all along while the chip's power moved by 1 W or more (or power is frozen too), so a
    # chip the host could not load is not mistaken for a stuck sensor
    drew = a.power_max is not None and a.power_min is not None and a.power_max - a.power_min >= 1.0
    if a.samples >= 5 and len(a.temperatures) == 1 and (drew or a.power_max == a.power_min):
        return BurnInRow(
            a.chip,
            "sensor",
            "FAIL",
            a.temperature_max,
            None,
            f"temperature frozen at {a.temperature_max:g} C in all {a.samples} samples under load (a stuck sensor)",
        )
    return BurnInRow(a.chip, "sensor", "PASS", None, None, f"{len(a.temperatures)}+ distinct temperature readings")


def _plot_limits(rows: list[BurnInRow]) -> dict[int, dict[str, float | None]]:
    out: dict[int, dict[str, float | None]] = {}
    for r in rows:
        if r.figure in ("temperature", "power"):
            out.setdefault(r.chip, {})[r.figure] = r.limit
    return out


def _verdict(rows: list[BurnInRow]) -> str:
    statuses = {r.status for r in rows}
    if "FAIL" in statuses:
        return "FAIL"
    if "WARN" in statuses or "NOT JUDGED" in statuses:
        return "WARN"
    return "PASS"


__all__ = ["BurnInLimits", "BurnInRow", "grade", "run_burnin"]
