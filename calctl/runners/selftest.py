"""``calctl device selftest``: host<->device transfers graded from a board profile, and memory pattern tests.

Rows (docs/runtime.md §8), each over :data:`SIZES` with ``repeats`` transfers a size:

* ``h2d chip N`` / ``d2h chip N``: one chip alone, ``write_mem`` then ``read_mem`` of the same bytes (what is
  read back must be what was written: a transfer that corrupts data fails its row, whatever its speed);
* ``h2d both chips`` / ``d2h both chips``: both chips at once from two threads, the aggregate over the
  union of their transfers;
* ``d2h stability chip N``: the variation of :data:`STABILITY_READS` reads' device-clock rates (standard deviation
  over mean; its ``figure_gbps`` holds that ratio), judged against the profile's ``d2h_cv_max``;
* ``host memcpy``: the host's own copy rate at the same sizes, beside them (the host's clock: never judged);
* ``memory chip N <pattern>``: walking ones, walking zeros, address-in-address (and its complement) and seeded
  random over a bounded part of each chip's self-test window, every byte read back and compared: PASS, or
  FAIL naming the first differing address, what was written and read, and the bits (no profile needed).

A device row's figure is the rate at the largest size, from the transfers' own stamps on the device's clock
(``MemTransfer``), so a busy host never fails a row (docs/testing.md, verdicts on a loaded host); the host's
wall-clock rate is reported beside it, not judged. With a board profile (``calculet-board-profile/v1``,
the vendor's expected figures) a row is PASS at or above its threshold and FAIL below it, naming the figure
and the threshold; without one, or without that row's threshold, it is NOT JUDGED with its figure. A runtime
without device memory access (a CalRT shim without the optional ``calrt_mem_window``/``calrt_write_mem``/
``calrt_read_mem`` of docs/calrt-c-abi.md §14) gets every row UNSUPPORTED and the grade C4 (designed, not shown),
never a pass.

Verdict: FAIL if a row failed (exit 1), PASS if every device row passed, else NOT JUDGED (exit 0); ERROR
(exit 3) when the device could not be opened. This module measures and grades; it does not render.
"""

from __future__ import annotations

import enum
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calctl.errors import ConfigError
from calctl.report import Report
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Opening, Run, RunState, RunStep, drive
from calctl.runtime import Runtime
from calctl.runtime.errors import NotSupported, RuntimeLayerError
from calctl.runtime.intervals import intersections, union
from calctl.runtime.memory import DeviceMemory, MemTransfer, TransferDirection

PROFILE_SCHEMA = "calculet-board-profile/v1"
MAX_PROFILE_BYTES = 64 * 1024
#: Transfer sizes: latency-bound, mid, bandwidth-bound (the judged one). All fit the mock's 64 MiB window.
SIZES = (64 * 1024, 1024**2, 16 * 1024**2)
#: Chips at once: how often the largest size is measured again while the host did not issue the chips' transfers
#: together (the figure is the link under all chips, so it needs them overlapping). A loaded host (8 CPU burners
#: and a test suite on 2 cores) ran one chip's five transfers before the other's thread got a core, and the row
#: was NOT JUDGED on a healthy board; one retry in a few sufficed there.
OVERLAP_TRIES = 6
GB = 1e9


class RowStatus(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    NOT_JUDGED = "NOT JUDGED"
    UNSUPPORTED = "UNSUPPORTED"
    MEASURED = "MEASURED"  # the host's own rate: a figure beside the others, never a gate


@dataclass(frozen=True)
class BoardProfile:
    """The thresholds of ``calculet-board-profile/v1`` (GB/s); None: no threshold, the row is not judged."""

    path: str
    thresholds: dict[str, float]
    board: str | None = None
    telemetry: dict[str, float] = field(default_factory=dict)  # calctl burn-in's limits (docs/burn-in.md)

    @classmethod
    def load(cls, path: Path) -> BoardProfile:
        """Read and check a profile; ConfigError (exit 2) names the file and the field."""
        from calctl.package import schemas, yamlsafe

        hint = f"see docs/runtime.md §8 for the {PROFILE_SCHEMA} format"
        name = f"--board-profile {path}"
        doc = yamlsafe.load_config(path, name=name, what="the board profile", max_bytes=MAX_PROFILE_BYTES, hint=hint)
        for where, message in schemas.iter_errors(PROFILE_SCHEMA, doc):
            raise ConfigError(f"{path}: {where}: {message}", hint=f"see docs/runtime.md §8 for {PROFILE_SCHEMA}")
        return cls(
            str(path),
            {k: float(v) for k, v in doc.get("transfer", {}).items()},
            doc.get("board"),
            {k: float(v) for k, v in doc.get("telemetry", {}).items()},
        )


@dataclass(frozen=True)
class Row:
    """One graded figure. ``figure_gbps``: device-clock rate at the largest size (None: not measured)."""

    name: str
    chips: tuple[int, ...]
    direction: str
    status: RowStatus
    figure_gbps: float | None
    threshold_gbps: float | None
    detail: str
    sizes: tuple[dict[str, Any], ...] = ()
    #: One chip's rows: the 95 % interval of the mean of its transfers' device-clock rates at the largest size
    #: (``calctl report compare`` judges a difference against it); None for chips at once and unstamped runtimes.
    interval: dict[str, Any] | None = None


@dataclass(frozen=True)
class Measured:
    """What one row's transfers gave at one size: rates on the device clock and on the host's."""

    bytes: int
    device_gbps: float | None
    host_gbps: float
    data_ok: bool
    together: float = 1.0  # chips at once: the share of the time every chip was transferring
    rates: tuple[float, ...] = ()  # one chip: each transfer's GB/s on the device clock (none without stamps)

    def document(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "device_gbps": _round(self.device_gbps),
            "host_gbps": _round(self.host_gbps),
            "data_ok": self.data_ok,
            "together": round(self.together, 3),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def run_selftest(device: DeviceSpec, *, profile: BoardProfile | None = None, repeats: int = 5, seed: int = 0) -> Report:
    """``calctl device selftest`` (module docstring)."""

    def report(s: RunState, ended: Ended) -> Report:
        rows: list[Row] = list(s.result("rows") or [])
        if not ended.stopped:  # nothing more after a signal or a lost device
            rows.append(_host_memcpy(repeats))
        verdict = _verdict(rows) if not ended.stopped else ended.outcome.value
        failed = [f"{r.name}: {r.detail}" for r in rows if r.status is RowStatus.FAIL]
        body = {
            "profile": None if profile is None else {"path": profile.path, "board": profile.board},
            "repeats": repeats,
            "sizes": list(SIZES),
            "rows": [_row_document(r) for r in rows],
        }
        error = ended.error or ("; ".join(failed) if failed else None)
        return s.report(verdict, body, error=error, reasons=failed, logged=False)

    rows = RunStep("rows", lambda s, note: _rows(s.rt, profile, repeats, seed), logged=False)
    return drive(Run("device selftest", device, [rows], report, opening=Opening.BARE))


def _verdict(rows: Sequence[Row]) -> str:
    device_rows = [r for r in rows if r.status is not RowStatus.MEASURED]
    if any(r.status is RowStatus.FAIL for r in device_rows):
        return "FAIL"
    if device_rows and all(r.status is RowStatus.PASS for r in device_rows):
        return "PASS"
    return "NOT JUDGED"  # measured, and something not judged (no profile, no stamps) or not supported


def _row_document(r: Row) -> dict[str, Any]:
    return {
        "name": r.name,
        "chips": list(r.chips),
        "direction": r.direction,
        "status": r.status.value,
        "figure_gbps": _round(r.figure_gbps),
        "threshold_gbps": r.threshold_gbps,
        "detail": r.detail,
        "sizes": list(r.sizes),
        "interval": r.interval,
    }


def _rows(rt: Runtime, profile: BoardProfile | None, repeats: int, seed: int) -> list[Row]:
    chips = tuple(range(rt.topology().chips))
    plan: list[tuple[str, tuple[int, ...], TransferDirection]]
    plan = [(f"{d.value} chip {c}", (c,), d) for c in chips for d in TransferDirection]
    plan += [(f"{d.value} both chips", chips, d) for d in TransferDirection] if len(chips) > 1 else []
    why = _unsupported(rt)
    if why is not None or not isinstance(rt, DeviceMemory):
        why = why or "UNSUPPORTED (C4): the runtime offers no device memory access"
        plan += [(f"d2h stability chip {c}", (c,), TransferDirection.D2H) for c in chips]
        unsupported = [Row(n, cs, d.value, RowStatus.UNSUPPORTED, None, None, why) for n, cs, d in plan]
        patterns = [(_pattern_label(c, name, seed), c) for c in chips for name, _ in PATTERNS]
        return unsupported + [Row(n, (c,), "memory", RowStatus.UNSUPPORTED, None, None, why) for n, c in patterns]
    rng = np.random.default_rng(seed)
    data = {size: rng.integers(0, 256, size, dtype=np.uint8) for size in SIZES}
    rows = []
    for name, cs, direction in plan:
        key = f"{'both_' if len(cs) > 1 else ''}{direction.value}_gbps_min"
        threshold = profile.thresholds.get(key) if profile is not None else None
        try:
            measured = [_measure(rt, cs, direction, data[size], repeats) for size in SIZES]
            for _ in range(OVERLAP_TRIES - 1 if len(cs) > 1 else 0):
                last = measured[-1]
                if last.device_gbps is not None or last.together >= 1.0:  # a figure, or no stamps to give one
                    break
                measured[-1] = _measure(rt, cs, direction, data[SIZES[-1]], repeats)
        except RuntimeLayerError as exc:
            rows.append(Row(name, cs, direction.value, RowStatus.FAIL, None, threshold, f"transfer failed: {exc}"))
            continue
        rows.append(_grade(name, cs, direction, measured, threshold, profile, key))
    return rows + _stability_rows(rt, chips, profile) + _pattern_rows(rt, chips, seed)


def _unsupported(rt: Runtime) -> str | None:
    """Why ``rt`` cannot do the memory rows (graded UNSUPPORTED, C4: designed, not shown), or None."""
    if not isinstance(rt, DeviceMemory):
        return (
            "UNSUPPORTED (C4): the runtime offers no device memory access (calrt_mem_window, calrt_write_mem, "
            "calrt_read_mem: optional calls, docs/calrt-c-abi.md §14)"
        )
    try:
        rt.test_window(0)
    except NotSupported as exc:  # a CalRT shim without the optional calls
        return f"UNSUPPORTED (C4): {exc.message}"
    return None


def _grade(
    name: str,
    chips: tuple[int, ...],
    direction: TransferDirection,
    measured: list[Measured],
    threshold: float | None,
    profile: BoardProfile | None,
    key: str,
) -> Row:
    sizes = tuple(m.document() for m in measured)
    last = measured[-1]
    figure = last.device_gbps
    bad = [m for m in measured if not m.data_ok]

    interval = None
    if len(last.rates) > 1:
        from calctl.checks.stats import bootstrap

        interval = bootstrap(list(last.rates)).as_dict()

    def row(status: RowStatus, detail: str) -> Row:
        return Row(name, chips, direction.value, status, figure, threshold, detail, sizes, interval)

    if bad:
        return row(RowStatus.FAIL, f"the bytes read back differ from those written ({bad[0].bytes} B transfers)")
    shown = "n/a" if figure is None else f"{figure:.2f} GB/s"
    together = f", all chips busy {last.together:.0%} of the time" if len(chips) > 1 else ""
    at = f"{shown} at {last.bytes // 1024**2} MiB on the device clock{together} (host clock {last.host_gbps:.2f} GB/s)"
    if figure is None:
        why = (
            "the runtime stamps no transfers: no device-clock figure"
            if last.together >= 1.0
            else f"the chips were all transferring {last.together:.0%} of the time, less than one transfer's "
            f"time, in each of {OVERLAP_TRIES} tries: the host did not issue them together (its doing, not the "
            "board's)"
        )
        return row(RowStatus.NOT_JUDGED, f"{why}; host clock {last.host_gbps:.2f} GB/s")
    if profile is None:
        return row(RowStatus.NOT_JUDGED, f"{at}; no board profile (--board-profile) to judge it against")
    if threshold is None:
        return row(RowStatus.NOT_JUDGED, f"{at}; the profile {profile.path} gives no {key}")
    if figure < threshold:
        return row(RowStatus.FAIL, f"{at}, below the profile's {key} {threshold:g} GB/s")
    return row(RowStatus.PASS, f"{at}, at least the profile's {key} {threshold:g} GB/s")


def _measure(
    rt: DeviceMemory, chips: tuple[int, ...], direction: TransferDirection, data: np.ndarray, repeats: int
) -> Measured:
    """``repeats`` transfers of ``data`` on every chip of ``chips`` at once (one thread a chip)."""
    if direction is TransferDirection.D2H:
        for c in chips:  # what the reads must give back
            rt.write_mem(c, rt.test_window(c)[0], data)
    results: dict[int, list[MemTransfer]] = {c: [] for c in chips}
    ok: dict[int, bool] = dict.fromkeys(chips, True)
    errors: list[Exception] = []
    barrier = threading.Barrier(len(chips))

    def work(c: int) -> None:
        address = rt.test_window(c)[0]
        out = np.empty_like(data)
        try:
            barrier.wait()
            for _ in range(repeats):  # back to back: no host work between them to space them out
                if direction is TransferDirection.H2D:
                    results[c].append(rt.write_mem(c, address, data))
                else:
                    results[c].append(rt.read_mem(c, address, out))
            if direction is TransferDirection.H2D:  # the written bytes arrived
                rt.read_mem(c, address, out)
            ok[c] = bool(np.array_equal(out, data))
        except Exception as exc:  # re-raised in the caller's thread (a signal reaches the main thread only)
            barrier.abort()
            errors.append(exc)

    t0 = time.perf_counter()
    _in_threads(work, chips)
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    transfers = [t for ts in results.values() for t in ts]
    moved = data.size * len(transfers)
    rate, together = _device_rate(transfers, moved)
    rates = (
        tuple(t.bytes / t.device_seconds / GB for t in transfers if t.device_seconds)
        if len(chips) == 1 and rate is not None
        else ()
    )
    return Measured(int(data.size), rate, moved / wall / GB, all(ok.values()), together, rates)


def _device_rate(transfers: Sequence[MemTransfer], moved: int) -> tuple[float | None, float]:
    """(GB/s on the device clock, the share of the time the chips all transferred at once).

    One chip: its bytes over the sum of its transfers' own durations (the host's gaps between them excluded).
    Chips at once: the bytes moved while every chip was transferring, over that time, so a host that could not
    issue them together lowers the share, never the figure (a transfer's bytes counted evenly over it). No
    stamps: no figure, share 1 (nothing is known to have failed to overlap)."""
    if not transfers or any(t.start_ns is None or t.end_ns is None for t in transfers):
        return None, 1.0
    by_chip: dict[int, list[tuple[int, int]]] = {}
    for t in transfers:
        by_chip.setdefault(t.chip, []).append((t.start_ns or 0, t.end_ns or 0))
    if len(by_chip) == 1:
        seconds = sum(t.device_seconds or 0.0 for t in transfers)
        return (moved / seconds / GB if seconds > 0 else None), 1.0
    spans = [union(v) for v in by_chip.values()]
    together = spans[0]
    for other in spans[1:]:
        together = intersections(together, other)
    overlap_ns = sum(e - s for s, e in together)
    union_ns = sum(e - s for s, e in union([x for v in by_chip.values() for x in v]))
    shortest = min((t.end_ns or 0) - (t.start_ns or 0) for t in transfers)
    if overlap_ns < max(shortest, 1) or union_ns <= 0:
        # Not one transfer's time with every chip busy: nothing to say about the link under all of them.
        return None, overlap_ns / union_ns if union_ns > 0 else 0.0
    inside = 0.0
    for t in transfers:
        s0, e0 = t.start_ns or 0, t.end_ns or 0
        if e0 > s0:
            covered = sum(max(0, min(e, e0) - max(s, s0)) for s, e in together)
            inside += t.bytes * covered / (e0 - s0)
    return inside / (overlap_ns / 1e9) / GB, overlap_ns / union_ns


def _in_threads(work: Callable[[int], None], chips: tuple[int, ...]) -> None:
    threads = [threading.Thread(target=work, args=(c,), name=f"selftest-chip{c}") for c in chips]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _host_memcpy(repeats: int) -> Row:
    """The host's own copy rate at the same sizes: what a transfer is beside (host clock, never judged)."""
    sizes = []
    for size in SIZES:
        src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        sizes.append({"bytes": size, "device_gbps": None, "host_gbps": _round(size / statistics.median(times) / GB)})
    figure = sizes[-1]["host_gbps"]
    return Row(
        "host memcpy",
        (),
        "host",
        RowStatus.MEASURED,
        figure,
        None,
        f"{figure:.2f} GB/s at {SIZES[-1] // 1024**2} MiB (numpy copy, the host's clock; beside the rows, not judged)",
        tuple(sizes),
    )


# ---------------------------------------------------------------------------
# Read-rate stability

#: Reads of STABILITY_BYTES each whose device-clock rates must agree (a link that drops now and then).
STABILITY_READS = 20
STABILITY_BYTES = 4 * 1024**2


def _stability_rows(rt: DeviceMemory, chips: tuple[int, ...], profile: BoardProfile | None) -> list[Row]:
    rows = []
    limit = profile.thresholds.get("d2h_cv_max") if profile is not None else None
    for c in chips:
        name = f"d2h stability chip {c}"
        try:
            rates = _read_rates(rt, c)
        except RuntimeLayerError as exc:
            rows.append(Row(name, (c,), "d2h", RowStatus.FAIL, None, limit, f"transfer failed: {exc}"))
            continue
        rows.append(_grade_stability(name, c, rates, limit, profile))
    return rows


def _read_rates(rt: DeviceMemory, chip: int) -> list[float] | None:
    """GB/s of each of STABILITY_READS reads on the device clock; None when the runtime stamps none."""
    base = rt.test_window(chip)[0]
    out = np.empty(STABILITY_BYTES, np.uint8)
    transfers = [rt.read_mem(chip, base, out) for _ in range(STABILITY_READS)]
    seconds = [t.device_seconds for t in transfers]
    if any(s is None or s <= 0 for s in seconds):
        return None
    return [STABILITY_BYTES / (s or 1.0) / GB for s in seconds]


def _grade_stability(
    name: str, chip: int, rates: list[float] | None, limit: float | None, profile: BoardProfile | None
) -> Row:
    if rates is None:
        why = "the runtime stamps no transfers: no device-clock figure"
        return Row(name, (chip,), "d2h", RowStatus.NOT_JUDGED, None, limit, why)
    mean = statistics.fmean(rates)
    cv = statistics.pstdev(rates) / mean if mean > 0 else 0.0
    at = (
        f"{len(rates)} reads of {STABILITY_BYTES // 1024**2} MiB on the device clock: variation {cv:.1%} "
        f"(slowest {min(rates):.2f}, median {statistics.median(rates):.2f} GB/s)"
    )

    def row(status: RowStatus, detail: str) -> Row:
        return Row(name, (chip,), "d2h", status, round(cv, 4), limit, detail)

    if limit is None:
        words = (
            "no board profile (--board-profile)"
            if profile is None
            else f"the profile {profile.path} gives no d2h_cv_max"
        )
        return row(RowStatus.NOT_JUDGED, f"{at}; {words} to judge it against")
    if cv > limit:
        return row(RowStatus.FAIL, f"{at}, more than the profile's d2h_cv_max {limit:.1%}")
    return row(RowStatus.PASS, f"{at}, within the profile's d2h_cv_max {limit:.1%}")


# ---------------------------------------------------------------------------
# Memory patterns (each chip's self-test window, bounded)

#: Walking ones/zeros: 64 passes (each 64-bit word sees every bit position) over this many bytes a chip.
WALK_BYTES = 256 * 1024
#: Address-in-address (and its complement) and seeded random: over this many bytes a chip.
PATTERN_BYTES = 16 * 1024**2


def _walking(ones: bool) -> Callable[[int, int], Iterator[np.ndarray]]:
    def passes(base: int, seed: int) -> Iterator[np.ndarray]:
        index = np.arange(WALK_BYTES // 8, dtype=np.uint64)
        for k in range(64):  # pass k: word i holds bit (i + k) mod 64 (ones), or all but it (zeros)
            words = np.left_shift(np.uint64(1), (index + np.uint64(k)) % np.uint64(64))
            yield (words if ones else ~words).view(np.uint8)

    return passes


def _address_in_address(base: int, seed: int) -> Iterator[np.ndarray]:
    words = np.uint64(base) + np.arange(PATTERN_BYTES // 8, dtype=np.uint64) * np.uint64(8)
    yield words.view(np.uint8)  # each word holds its own address: catches aliased address lines
    yield (~words).view(np.uint8)  # and its complement: every data bit both ways


def _random(base: int, seed: int) -> Iterator[np.ndarray]:
    yield np.random.default_rng(seed).integers(0, 256, PATTERN_BYTES, dtype=np.uint8)


PATTERNS: tuple[tuple[str, Callable[[int, int], Iterator[np.ndarray]]], ...] = (
    ("walking ones", _walking(True)),
    ("walking zeros", _walking(False)),
    ("address in address", _address_in_address),
    ("random", _random),
)


def _pattern_rows(rt: DeviceMemory, chips: tuple[int, ...], seed: int) -> list[Row]:
    rows = []
    for c in chips:
        base = rt.test_window(c)[0]
        for name, passes in PATTERNS:
            label = _pattern_label(c, name, seed)
            try:
                rows.append(_pattern_row(rt, c, label, passes(base, seed), base))
            except RuntimeLayerError as exc:
                rows.append(Row(label, (c,), "memory", RowStatus.FAIL, None, None, f"transfer failed: {exc}"))
    return rows


def _pattern_label(chip: int, name: str, seed: int) -> str:
    return f"memory chip {chip} {name}" + (f" (seed {seed})" if name == "random" else "")


def _pattern_row(rt: DeviceMemory, chip: int, label: str, passes: Iterator[np.ndarray], base: int) -> Row:
    """Write each pass, read it back, compare every byte; the first difference is named by its address."""
    moved, n = 0, 0
    for k, data in enumerate(passes, 1):
        rt.write_mem(chip, base, data)
        out = np.empty_like(data)
        rt.read_mem(chip, base, out)
        moved, n = data.size, k
        diff = np.flatnonzero(out != data)
        if diff.size:
            at = int(diff[0])
            wrote, read = int(data[at]), int(out[at])
            bits = [b for b in range(8) if (wrote ^ read) >> b & 1]
            detail = (
                f"{diff.size} byte(s) differ in pass {k}; the first at {base + at:#x}: wrote {wrote:#04x}, read "
                f"{read:#04x} (bit {', '.join(map(str, bits))})"
            )
            return Row(label, (chip,), "memory", RowStatus.FAIL, None, None, detail)
    detail = f"{n} pass(es) over {moved // 1024} KiB at {base:#x}: every byte read back as written"
    return Row(label, (chip,), "memory", RowStatus.PASS, None, None, detail)


__all__ = ["PATTERNS", "PROFILE_SCHEMA", "SIZES", "BoardProfile", "Row", "RowStatus", "run_selftest"]
