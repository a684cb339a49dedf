"""``calctl soak``, the judgement: the checks a soak makes of every request, after every unload and at the end,
recorded as violations in the :class:`~calctl.runners.soak.state.SoakState`, and the verdict they make.

The invariants themselves are :mod:`calctl.runners.soak.checks`; this module says when each is applied and
what explains an error (an injected fault of the mock's plan).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass

from calctl.budget.host import proc_status_bytes
from calctl.runners.soak import checks, host_memory
from calctl.runners.soak.state import SoakState, read_counters
from calctl.runners.traffic import EngineResult, RequestOutcome
from calctl.runtime.history import KeepsJobHistory
from calctl.runtime.interface import FaultInjecting, Runtime
from calctl.runtime.types import ChipCounters
from calctl.serving.engine import DeviceSupervisor

ADMITTED_OUTCOMES = frozenset({RequestOutcome.OK, RequestOutcome.CANCELLED, RequestOutcome.DEVICE_ERROR})


def request_violations(
    res: EngineResult, newest: int | None, *, cycle: int | None, at: float
) -> list[checks.Violation]:
    """One finished request: exactly one end, its token count and generations, an invalid one never admitted."""
    found = checks.check_request(res, cycle=cycle, at_s=at) + checks.check_generations(
        res, newest, cycle=cycle, at_s=at
    )
    if res.record.kind == "invalid" and (res.token_generations or res.record.outcome in ADMITTED_OUTCOMES):
        # 001 §11.3: an invalid request is refused before the device (400; 503 while the model is away is fine).
        found.append(
            checks.Violation(
                "invalid_admitted",
                f"{res.record.alias}: a prompt of {res.record.prompt_tokens} "
                f"tokens, over the context limit, was admitted and ended "
                f"{res.record.outcome.value}",
                cycle,
                at,
                subject=f"{res.record.alias}:invalid",
            )
        )
    return found


@dataclass(frozen=True)
class AfterUnload:
    """What the checks after one unload measured (the cycle record's evidence) and how many violations they found."""

    drifts: list[checks.ChipDrift]
    counters: list[ChipCounters]
    submitted_in_cycle: dict[int, int]
    rss: int | None
    found: int


def after_unload(
    s: SoakState,
    sup: DeviceSupervisor,
    rt: Runtime,
    cycle: int,
    counters_before: list[ChipCounters],
    submitted_before: dict[int, int],
) -> AfterUnload:
    """Per chip: memory against the baseline, job counters closed; the host's VmRSS; engine cores drained."""
    at = s.now_s()
    mem = s.sample_memory() or []
    drifts, mem_violations = checks.check_memory(s.baseline, mem, cycle=cycle, at_s=at, dram=s.dram)
    for d in drifts:
        if d.drift_bytes is not None:
            prev = s.max_drift.get(d.chip)
            s.max_drift[d.chip] = d.drift_bytes if prev is None or abs(d.drift_bytes) > abs(prev) else prev
    after = read_counters(rt)
    submitted_now = s.submits.submitted()
    delta = {chip: n - submitted_before.get(chip, 0) for chip, n in submitted_now.items()}
    found = mem_violations + checks.check_counters(counters_before, after, delta, cycle=cycle, at_s=at)
    gc.collect()  # unreachable cycles are not a leak
    rss = proc_status_bytes("VmRSS")
    s.host_rss.append((cycle, rss))  # judged over the run, at the end (host_memory_checks)
    s.history_reported = isinstance(rt, KeepsJobHistory)
    if s.caches_full_at is None and isinstance(rt, KeepsJobHistory) and rt.job_history().full:
        s.caches_full_at = cycle  # the bounded history levelled off: the trend starts after it
    for alias, w in sup.cores.items():
        if w.inflight() or w.quarantined():
            found.append(
                checks.Violation(
                    "worker_not_drained",
                    f"{alias}: {w.inflight()} job(s) in flight and {w.quarantined()} quarantined "
                    f"after the unload of cycle {cycle}",
                    cycle,
                    at,
                    subject=alias,
                )
            )
    for v in found:
        s.violate(v)
    return AfterUnload(drifts, after, delta, rss, len(found))


def host_memory_checks(s: SoakState) -> host_memory.HostMemoryVerdict:
    """The serving process's memory over the run (:mod:`calctl.runners.soak.host_memory`): a trend after the
    warm-up, or the fixed limit of a short run. Each finding is a ``host_memory_growth`` violation."""
    v = host_memory.judge(s.host_rss, s.caches_full_at, reported=s.history_reported)
    at = s.now_s()
    if v.method == "trend" and not v.ok:
        assert v.trend is not None
        s.violate(
            checks.Violation(
                "host_memory_growth",
                f"serving process: resident memory (VmRSS) grows {v.words()}: a host-side leak the device "
                "counters do not show",
                v.trend.last_cycle,
                at,
                subject="host_rss",
                detail=v.document(),
            )
        )
    for cycle, growth in v.over_limit:
        assert v.reference_bytes is not None and v.limit_bytes is not None
        s.violate(checks.host_rss_violation(v.reference_bytes, growth, v.limit_bytes, cycle=cycle, at_s=at))
    return v


def final_checks(s: SoakState, sup: DeviceSupervisor) -> None:
    """At the end: no request open, no device error or missed drain deadline that no injected fault explains,
    the process's memory judged over the run."""
    at = s.now_s()
    host_memory_checks(s)
    with s.requests.lock:
        open_requests = s.requests.outstanding
    if open_requests:
        s.violate(
            checks.Violation(
                "requests_open", f"{open_requests} request(s) never ended", s.cycle_index(), at, subject="end"
            )
        )
    for alias, w in sup.cores.items():
        if w.live_requests() and s.interrupted is not None:
            # A signal cut the soak short: its clients were cancelled, not drained, so requests the engine
            # still holds (waiting for a load the signal stopped) are what the interrupt left, failed at
            # shutdown, not a finding of a final drain that never ran (requests.open counts the clients').
            s.interrupted.engine_requests_left[alias] = w.live_requests()
            s.events.write("requests_cut_short", alias=alias, engine_requests=w.live_requests())
        elif w.live_requests():
            s.violate(
                checks.Violation(
                    "requests_open",
                    f"{alias}: the engine still holds {w.live_requests()} request(s) after the final drain",
                    s.cycle_index(),
                    at,
                    subject=f"{alias}:end",
                )
            )
    explained = injected_runtime_faults(s)
    errors = device_errors(sup)
    n_device_errors = int(sum(errors.values(), 0))
    device_error_requests = s.requests.by_outcome[RequestOutcome.DEVICE_ERROR.value]
    if not explained and (n_device_errors or device_error_requests):
        s.violate(
            checks.Violation(
                "unexpected_errors",
                f"{n_device_errors} device error(s) and {device_error_requests} request(s) failed "
                f"on the device ({', '.join(f'{k}={v}' for k, v in sorted(errors.items())) or 'by request'}) "
                "with no injected fault to explain them",
                s.cycle_index(),
                at,
                subject="device",
            )
        )
    if not explained and s.drain_deadline_hits:
        s.violate(
            checks.Violation(
                "drain_deadline",
                f"{s.drain_deadline_hits} unload(s) missed the drain deadline "
                f"of {s.config.drain_deadline_s:g} s with no injected fault",
                s.cycle_index(),
                at,
                subject="drain",
            )
        )


def injected_runtime_faults(s: SoakState) -> int:
    """How many faults the mock's plan injected that explain device errors (a memory leak explains none)."""
    rt = s.rt
    if not isinstance(rt, FaultInjecting):
        return 0
    return sum(1 for f in rt.injected_faults() if f.kind.value not in ("memory_leak", "host_memory_leak"))


def device_errors(sup: DeviceSupervisor) -> dict[str, int]:
    """``model/error`` -> count of the engine's device errors."""
    return {
        f"{labels['model']}/{labels['error']}": int(v) for labels, v in samples(sup, "calctl_device_errors_total") if v
    }


def samples(sup: DeviceSupervisor | None, family: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every ``family`` sample in the engine's metrics (counters: the ``_total`` samples)."""
    if sup is None:
        return []
    out: list[tuple[dict[str, str], float]] = []
    for metric in sup.metrics.registry.collect():
        for s in metric.samples:
            if s.name == family and not math.isnan(s.value):
                out.append((dict(s.labels), s.value))
    return out


def verdict(s: SoakState) -> str:
    """The soak's word in docs/cli.md's vocabulary: PASS, FAIL, INTERRUPTED, ERROR (RUNNING while it runs)."""
    if s.status == "interrupted":
        return "INTERRUPTED"
    if s.status == "error":
        return s.error_verdict  # the word of what ended it: ERROR (device), FAIL (refused), TIMEOUT
    if s.phase != "done":
        return "RUNNING"
    return "PASS" if s.status == "finished" and not len(s.violations) else "FAIL"
