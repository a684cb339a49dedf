"""The soak's invariants, as pure functions over what was measured (001 §13.1, §13.3; 000 §19 M0/M4).

* memory: after every unload each chip is back at the baseline measured before
  the first load, within ``max(64 MiB, 1 % of the chip's local DRAM)``
  (:func:`drift_limit_bytes`, 001 §13.3);
* job counters close: after the drain no job is pending on any chip, and the
  jobs the host submitted in the cycle (counted at the runtime boundary) equal
  the jobs the device reports finished or failed (:func:`check_counters`);
* generations: every token a request receives carries the generation it was
  admitted under, which is never older than the generation the model served
  when the request arrived (:func:`check_generations`, 001 §13.1 "reload 后旧
  completion 不得交付给新 generation");
* requests: every request ends exactly once, within the client's limit, with
  as many token events as the engine reports (:func:`check_request`);
* host memory: the serving process's own resident set (``VmRSS``) after every
  unload, judged over the run by its trend after the warm-up, or in a short run
  against ``max(64 MiB, 10 %)`` over the first cycle's
  (:mod:`calctl.runners.soak.host_memory`; :func:`host_rss_violation` words the
  latter): a leak in the process does not show in the device counters.

A :class:`Violation` names what broke (chip, request, generation, counts). The
:class:`ViolationBook` merges repeats of the same violation (a leak shows after
every later unload too) so a 24-hour report stays readable. Nothing here runs
anything or touches a device.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calctl.runners.soak import host_memory
from calctl.runners.traffic import EngineResult, RequestOutcome
from calctl.runtime.memory_figures import memory_findings
from calctl.runtime.types import ChipCounters, ChipMemory, Topology

MIB = 1024**2
#: 001 §13.3: stable drift must stay below max(64 MiB, 1 % local DRAM).
DRIFT_FLOOR_BYTES = 64 * MIB
DRIFT_FRACTION = 0.01


def drift_limit_bytes(total_bytes: int) -> int:
    return max(DRIFT_FLOOR_BYTES, int(total_bytes * DRIFT_FRACTION))


def host_rss_limit_bytes(reference_bytes: int) -> int:
    """A short run's fixed limit on the process's VmRSS growth (:func:`calctl.runners.soak.host_memory.fixed_limit_bytes`)."""
    return host_memory.fixed_limit_bytes(reference_bytes)


@dataclass(frozen=True)
class Violation:
    """One broken invariant. ``kind`` is a stable identifier; ``message`` names chip / request / generation."""

    kind: str
    message: str
    cycle: int | None
    at_s: float  # seconds since the soak started
    subject: str = ""  # what it is about (chip0, model-a, request id): repeats of (kind, subject) are merged
    detail: Mapping[str, Any] = field(default_factory=dict)


class ViolationBook:
    """Thread-safe list of violations; a repeat of (kind, subject) bumps a count instead of a new entry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, v: Violation) -> bool:
        """Record ``v``; True when it is new (not a repeat)."""
        key = (v.kind, v.subject or v.message)
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self._items[key] = {
                    "kind": v.kind,
                    "message": v.message,
                    "cycle": v.cycle,
                    "at_s": round(v.at_s, 3),
                    "subject": v.subject or None,
                    "detail": dict(v.detail),
                    "occurrences": 1,
                    "last_cycle": v.cycle,
                    "last_message": v.message,
                }
                return True
            entry["occurrences"] += 1
            entry["last_cycle"] = v.cycle
            entry["last_message"] = v.message
            return False

    def documents(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._items.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


# ---------------------------------------------------------------------------
# Memory


@dataclass(frozen=True)
class ChipDrift:
    chip: int
    baseline_bytes: int | None
    used_bytes: int | None
    total_bytes: int | None

    @property
    def drift_bytes(self) -> int | None:
        if self.used_bytes is None or self.baseline_bytes is None:
            return None
        return self.used_bytes - self.baseline_bytes

    @property
    def limit_bytes(self) -> int | None:
        return None if self.total_bytes is None else drift_limit_bytes(self.total_bytes)

    @property
    def ok(self) -> bool | None:
        """None when the runtime does not report the chip's memory (never a made-up pass)."""
        d, lim = self.drift_bytes, self.limit_bytes
        if d is None or lim is None:
            return None
        return abs(d) <= lim

    def document(self) -> dict[str, Any]:
        d, lim = self.drift_bytes, self.limit_bytes
        return {
            "chip": self.chip,
            "baseline_bytes": self.baseline_bytes,
            "used_bytes": self.used_bytes,
            "drift_bytes": d,
            "drift_mib": None if d is None else round(d / MIB, 3),
            "limit_bytes": lim,
            "ok": self.ok,
        }


def check_memory(
    baseline: Sequence[ChipMemory],
    now: Sequence[ChipMemory],
    *,
    cycle: int | None,
    at_s: float,
    dram: Mapping[int, int | None] | None = None,
) -> tuple[list[ChipDrift], list[Violation]]:
    """Per chip, the drift from the baseline after an unload (001 §13.3); a violation names chip and drift.

    The limit scales with the chip's DRAM as the **topology** reports it (``dram``), never with the usage call's
    own ``total``: a shim whose figures are KiB would otherwise shrink the limit with the leak it hides
    (:func:`check_memory_units` catches such figures)."""
    base = {m.chip: m for m in baseline}
    drifts: list[ChipDrift] = []
    violations: list[Violation] = []
    for m in now:
        b = base.get(m.chip)
        total = m.total_bytes if m.total_bytes is not None else (b.total_bytes if b else None)
        if dram is not None and dram.get(m.chip) is not None:
            total = dram[m.chip]
        cd = ChipDrift(m.chip, b.used_bytes if b else None, m.used_bytes, total)
        drifts.append(cd)
        if cd.ok is False:
            d, lim = cd.drift_bytes, cd.limit_bytes
            assert d is not None and lim is not None and total is not None
            violations.append(
                Violation(
                    "memory_drift",
                    f"chip {m.chip}: memory {'+' if d >= 0 else ''}{d / MIB:.1f} MiB from the baseline after the unload of "
                    f"cycle {cycle} (limit {lim / MIB:.1f} MiB = max(64 MiB, "
                    f"1 % of {total / MIB:.0f} MiB local DRAM), 001 §13.3)",
                    cycle,
                    at_s,
                    subject=f"chip{m.chip}",
                    detail={
                        "chip": m.chip,
                        "drift_bytes": d,
                        "limit_bytes": lim,
                        "used_bytes": m.used_bytes,
                        "baseline_bytes": cd.baseline_bytes,
                    },
                )
            )
    return drifts, violations


def host_rss_violation(reference: int, growth: int, limit: int, *, cycle: int, at_s: float) -> Violation:
    """A short run's unload whose VmRSS is over the fixed limit (the first cycle's VmRSS is the reference: the
    first load builds or maps what every later one reuses: native kernels, imported modules, arenas)."""
    return Violation(
        "host_memory_growth",
        f"serving process: resident memory (VmRSS) +{growth / MIB:.1f} MiB after the unload of cycle {cycle} "
        f"from {reference / MIB:.1f} MiB after the first cycle's unload (limit {limit / MIB:.1f} MiB = "
        f"max(64 MiB, 10 % of that); fixed limit: the run is too short for a trend, which needs "
        f"{host_memory.MIN_TREND_CYCLES} cycles after the warm-up; a host-side leak the device counters do not show)",
        cycle,
        at_s,
        subject="host_rss",
        detail={
            "rss_bytes": reference + growth,
            "reference_bytes": reference,
            "growth_bytes": growth,
            "limit_bytes": limit,
        },
    )


# ---------------------------------------------------------------------------
# Job counters


def check_counters(
    before: Sequence[ChipCounters],
    after: Sequence[ChipCounters],
    submitted: Mapping[int, int],
    *,
    cycle: int | None,
    at_s: float,
) -> list[Violation]:
    """After a drain: nothing pending, and every job submitted since ``before`` finished or failed.

    ``submitted`` counts the jobs the host submitted per chip over the same
    interval (the soak counts them at the runtime boundary). A counter the
    runtime does not report (None) is not checked.
    """
    out: list[Violation] = []
    prev = {c.chip: c for c in before}
    for c in after:
        if c.pending is not None and c.pending != 0:
            out.append(
                Violation(
                    "counters_open",
                    f"chip {c.chip}: {c.pending} job(s) still pending after the drain of "
                    f"cycle {cycle} (001 §13.3: counters must close)",
                    cycle,
                    at_s,
                    subject=f"chip{c.chip}",
                    detail={"chip": c.chip, "pending": c.pending},
                )
            )
        p = prev.get(c.chip)
        if p is None or None in (c.finished, c.failed, p.finished, p.failed):
            continue
        ended = (c.finished - p.finished) + (c.failed - p.failed)  # type: ignore[operator]
        sent = submitted.get(c.chip, 0)
        if ended != sent:
            out.append(
                Violation(
                    "counters_mismatch",
                    f"chip {c.chip}: the host submitted {sent} job(s) in cycle {cycle}, the device reports "
                    f"{c.finished - p.finished} finished + {c.failed - p.failed} failed = {ended}",  # type: ignore[operator]
                    cycle,
                    at_s,
                    subject=f"chip{c.chip}",
                    detail={"chip": c.chip, "submitted": sent, "ended": ended},
                )
            )
    return out


# ---------------------------------------------------------------------------
# Requests and generations


def check_generations(
    result: EngineResult, newest_generation: int | None, *, cycle: int | None, at_s: float
) -> list[Violation]:
    """No completion from another generation is delivered (001 §13.1, 000 §4 rule 4).

    The generation a request was *admitted under* is the generation of the job
    that produced its first token: the scheduler starts a request's prefill
    under the generation that admitted it, and a reload or reset fails every
    request of the retired generation. So every later token must carry the same
    generation; it can never be older than the generation the model served
    when the request was submitted (``served_generation``), nor newer than the
    newest the model has published.
    """
    gens = result.token_generations
    rec = result.record
    if not gens:
        return []
    out: list[Violation] = []
    subject = f"{rec.alias}:{result.request_id}"
    if any(g is None for g in gens):
        out.append(
            Violation(
                "untagged_token",
                f"{rec.alias}: request {result.request_id} received a token without a "
                "generation tag; the generation rule cannot be checked",
                cycle,
                at_s,
                subject=rec.alias,
            )
        )
        return out
    admitted = gens[0]
    assert admitted is not None

    def stale(message: str, **detail: Any) -> Violation:
        return Violation(
            "stale_generation",
            f"{rec.alias}: request {result.request_id}{message}",
            cycle,
            at_s,
            subject=subject,
            detail={"alias": rec.alias, "request_id": result.request_id, "admitted_generation": admitted, **detail},
        )

    for i, g in enumerate(gens[1:], start=1):
        if g != admitted:
            out.append(
                stale(
                    f", admitted under generation {admitted}, received token #{i} from generation {g} "
                    "(001 §13.1: no completion from another generation is delivered)",
                    token_generation=g,
                    token_index=i,
                )
            )
            break
    served = result.served_generation
    if served is not None and admitted < served:
        out.append(
            stale(
                f" was served by generation {admitted}, older than generation {served} that served the model when "
                "the request was submitted",
                served_generation=served,
            )
        )
    if newest_generation is not None and admitted > newest_generation:
        out.append(
            Violation(
                "unknown_generation",
                f"{rec.alias}: request {result.request_id} received tokens of generation {admitted}, never published "
                f"(newest {newest_generation})",
                cycle,
                at_s,
                subject=subject,
            )
        )
    return out


def check_memory_units(
    baseline: Sequence[ChipMemory],
    loaded: Sequence[ChipMemory],
    *,
    topology: Topology,
    weights: Mapping[int, int],
    cycle: int | None,
    at_s: float,
) -> list[Violation]:
    """The memory figures are bytes of the chip asked for (issue 50; docs/calrt-c-abi.md MEM-1, MEM-2), checked
    once, after the first load: the figures agree with the topology and with themselves
    (:func:`calctl.runtime.memory_figures.memory_findings`), and each chip's ``used`` grew by at least the weights
    the package put on it. A figure in KiB, or the two chips' figures swapped, fails here, naming
    ``calrt_memory_usage``, before any drift is judged against it."""
    base = {m.chip: m for m in baseline}
    problems: dict[int, list[str]] = {}
    for f in memory_findings(topology, loaded):
        problems.setdefault(f.chip, []).append(f.detail)
    for m in loaded:
        b, need = base.get(m.chip), weights.get(m.chip, 0)
        if need and m.used_bytes is not None and b is not None and b.used_bytes is not None:
            grown = m.used_bytes - b.used_bytes
            if grown < need:
                problems.setdefault(m.chip, []).append(f"used grew {grown} B with {need} B of weights loaded on it")
    return [
        Violation(
            "memory_figures",
            f"chip {chip}: calrt_memory_usage is not bytes of this chip ({'; '.join(found)}): KiB, or another "
            "chip's figure; the soak's drift check cannot be trusted on it",
            cycle,
            at_s,
            subject=f"chip{chip}:figures",
            detail={"chip": chip, "weights_bytes": weights.get(chip, 0), "problems": found},
        )
        for chip, found in sorted(problems.items())
    ]


def check_request(result: EngineResult, *, cycle: int | None, at_s: float) -> list[Violation]:
    """A request ends within the client's limit, and the tokens it got are the tokens the engine reports."""
    rec = result.record
    out: list[Violation] = []
    if rec.outcome is RequestOutcome.TIMEOUT:
        out.append(
            Violation(
                "request_hung",
                f"{rec.alias}: request {result.request_id} ({rec.kind}) got no terminal event "
                f"within the client's limit: {rec.error}",
                cycle,
                at_s,
                subject=f"{rec.alias}:hung",
            )
        )
        return out
    reported = result.completion_tokens_reported
    if reported is not None and reported != len(result.token_generations):
        out.append(
            Violation(
                "token_count",
                f"{rec.alias}: request {result.request_id} ({rec.kind}) received {len(result.token_generations)} token "
                f"event(s), the engine reports {reported} completion token(s)",
                cycle,
                at_s,
                subject=f"{rec.alias}:{result.request_id}",
                detail={"received": len(result.token_generations), "reported": reported},
            )
        )
    return out


__all__ = [
    "DRIFT_FLOOR_BYTES",
    "MIB",
    "ChipDrift",
    "Violation",
    "ViolationBook",
    "check_counters",
    "check_generations",
    "check_memory",
    "check_request",
    "drift_limit_bytes",
    "host_rss_limit_bytes",
    "host_rss_violation",
]
