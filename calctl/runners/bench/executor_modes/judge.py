"""Scenario ``executor-modes``, the judgement: the rounds against M1 and M2 (000 §19) with bootstrapped deltas and
the one decision rule, and what the ping/pong trace shows (000 §14: two in flight is not two computing)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calctl.checks import host
from calctl.checks.stats import Estimate, bootstrap, decide, percentiles
from calctl.runners.bench.executor_modes.plan import (
    M1_P50_LIMIT,
    M1_P99_LIMIT,
    M2_GAIN_LIMIT,
    M2_P99_LIMIT,
    ExecutorModesOptions,
    ModeRound,
    PhaseProfile,
)
from calctl.runners.device import DeviceSpec
from calctl.runtime import TraceEvent
from calctl.runtime.types import JobPhase
from calctl.serving.config import ExecutorMode

#: Which clock a check reads (docs/runners.md §1a).
DEVICE, HOST = "device", "host"


@dataclass(frozen=True)
class ModeCheck:
    name: str
    rule: str
    estimate: Estimate
    passed: bool | None  # None: inconclusive (the interval straddles the limit, or there is none)
    detail: str

    def document(self) -> dict[str, Any]:
        head = {"name": self.name, "rule": self.rule}
        return {**head, **self.estimate.as_dict(), "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class Milestone:
    name: str
    verdict: str  # met | not met | inconclusive
    checks: tuple[ModeCheck, ...]
    notes: tuple[str, ...] = ()

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "checks": [c.document() for c in self.checks],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class PingPongTraceEvidence:
    """What the ping/pong rounds' per-chip trace shows (000 §14: shown, not assumed). Seconds."""

    jobs: int
    busy_s: float  # union of job intervals
    two_in_flight_s: float  # two jobs between start and end at once
    compute_overlap_s: float | None  # two computes at once (None: the runtime reports no phases)
    transfer_compute_overlap_s: float | None  # one job's h2d/d2h while another computes

    def document(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ExecutorModesResult:
    device: str
    mock: bool
    alias: str
    profile: PhaseProfile | None
    time_scale: float | None
    options: dict[str, Any]
    per_mode: dict[str, dict[str, Any]]
    m1: Milestone
    m2: Milestone
    outputs_identical: bool
    evidence: PingPongTraceEvidence
    automatic_downgrades: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    trace_path: Path | None = None
    plot_path: Path | None = None

    def document(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "mock_result": self.mock,
            "alias": self.alias,
            "phase_profile": None
            if self.profile is None
            else {
                "name": self.profile.name,
                "h2d_share": self.profile.h2d_share,
                "compute_share": self.profile.compute_share,
                "d2h_share": self.profile.d2h_share,
            },
            "time_scale": self.time_scale,
            "workload": self.options,
            "modes": self.per_mode,
            "M1": self.m1.document(),
            "M2": self.m2.document(),
            "outputs_identical": self.outputs_identical,
            "trace_evidence": self.evidence.document(),
            "automatic_downgrades": self.automatic_downgrades,
            "notes": self.notes,
            "trace": str(self.trace_path) if self.trace_path else None,
            "plot": str(self.plot_path) if self.plot_path else None,
        }


@dataclass(frozen=True)
class _Rounds:
    """The measured rounds of every mode against the sync baseline: bootstrapped deltas and the sanity checks."""

    rounds: dict[ExecutorMode, list[ModeRound]]
    seed: int

    @property
    def base(self) -> list[ModeRound]:
        return self.rounds[ExecutorMode.SYNC]

    @functools.cached_property
    def identical(self) -> dict[ExecutorMode, bool]:
        """Per mode: every request produced the sync baseline's tokens."""
        reference = next((t for r in self.base for t, rec in zip(r.tokens, r.records, strict=True) if rec.ok), None)
        return {
            m: all(rec.ok and t == reference for r in rs for t, rec in zip(r.tokens, r.records, strict=True))
            for m, rs in self.rounds.items()
        }

    @property
    def device_clock(self) -> bool:
        """The device's clock when every measured round has its jobs' stamps (docs/runners.md §1a)."""
        return bool(self.base) and all(r.device_busy_s for rs in self.rounds.values() for r in rs)

    def delta(self, mode: ExecutorMode, q: float, clock: str = HOST) -> Estimate:
        """``mode``'s ``q``-th percentile E2E against sync's, minus one."""
        other, base = self.rounds[mode], self.base

        def stat(idx: np.ndarray) -> float:
            rows = idx.astype(int)
            a = _e2e([other[i] for i in rows], clock)
            b = _e2e([base[i] for i in rows], clock)
            return float(np.percentile(a, q) / np.percentile(b, q) - 1) if len(a) and len(b) else float("nan")

        return bootstrap(list(range(len(base))), stat, seed=self.seed)

    def gain(self, mode: ExecutorMode, clock: str = HOST) -> Estimate:
        """``mode``'s aggregate tokens/s against sync's, minus one."""
        other, base = self.rounds[mode], self.base

        def spent(r: ModeRound) -> float:
            return (r.device_busy_s or 0.0) if clock == DEVICE else r.wall_s

        def stat(idx: np.ndarray) -> float:
            rows = idx.astype(int)
            tm = sum(other[i].output_tokens for i in rows) / sum(spent(other[i]) for i in rows)
            tb = sum(base[i].output_tokens for i in rows) / sum(spent(base[i]) for i in rows)
            return float(tm / tb - 1)

        return bootstrap(list(range(len(base))), stat, seed=self.seed)

    def sanity(self, mode: ExecutorMode) -> list[ModeCheck]:
        errors = sum(r.errors for r in self.rounds[mode])
        same = self.identical[mode]
        return [
            ModeCheck(
                "errors",
                "== 0",
                Estimate(float(errors), None, None, sum(len(r.records) for r in self.rounds[mode])),
                errors == 0,
                f"{errors} request(s) did not finish normally",
            ),
            ModeCheck(
                "same_tokens",
                "== sync",
                Estimate(1.0 if same else 0.0, None, None, 1),
                same,
                "every request produced the sync baseline's tokens"
                if same
                else "some request's tokens differ from the sync baseline: not equivalent",
            ),
        ]


def judge(
    opts: ExecutorModesOptions,
    device: DeviceSpec,
    alias: str,
    rounds: dict[ExecutorMode, list[ModeRound]],
    events: Sequence[TraceEvent],
    auto_downgrades: list[dict[str, Any]],
    host_load: Sequence[float] = (),
) -> ExecutorModesResult:
    measured = _Rounds(rounds, opts.seed)
    device_clock = measured.device_clock
    m1_checks = [
        _at_most("p50_e2e_regression", measured.delta(ExecutorMode.ASYNC, 50), M1_P50_LIMIT, "async P50 E2E vs sync"),
        _at_most("p99_e2e_regression", measured.delta(ExecutorMode.ASYNC, 99), M1_P99_LIMIT, "async P99 E2E vs sync"),
        *measured.sanity(ExecutorMode.ASYNC),
    ]
    # M2 is about the chip: ping/pong hides one job's transfers behind the other's compute (000 §14). On the
    # device's clock its throughput is tokens per second the chips were busy, and its latency each request's E2E
    # without the gaps in which the chips waited on the host: a busy host neither grants nor denies it.
    m2_clock = DEVICE if device_clock else HOST
    on = " (device clock: chip-busy time)" if device_clock else ""
    m2_checks = [
        _at_least(
            "throughput_gain",
            measured.gain(ExecutorMode.PINGPONG, m2_clock),
            M2_GAIN_LIMIT,
            f"ping/pong aggregate tokens/s vs sync{on}",
        ),
        _at_most(
            "p99_e2e_regression",
            measured.delta(ExecutorMode.PINGPONG, 99, m2_clock),
            M2_P99_LIMIT,
            f"ping/pong P99 E2E vs sync{on}",
        ),
        *measured.sanity(ExecutorMode.PINGPONG),
    ]
    evidence = trace_evidence(events)
    if host.saturated(host_load):
        why = host.saturation_note(host_load, "the rounds")
        m1_checks[:2] = [_host_bound(c, f"{why}; {M1_HOST_TIME}") for c in m1_checks[:2]]
        if device_clock:
            m2_checks[0] = _device_gain_on_busy_host(m2_checks[0], evidence, why, bool(events))
        else:
            m2_checks[:2] = [_host_bound(c, why) for c in m2_checks[:2]]
    return ExecutorModesResult(
        device=device.kind.value,
        mock=device.is_mock,
        alias=alias,
        profile=opts.profile if device.is_mock else None,
        time_scale=device.time_scale if device.is_mock else None,
        options={
            "rounds": opts.rounds,
            "rounds_run": len(measured.base),
            "host_load": [round(x, 2) for x in host_load],
            "warmup_rounds": opts.warmup_rounds,
            "concurrency": opts.concurrency,
            "prompt_tokens": opts.prompt_tokens,
            "output_tokens": opts.output_tokens,
            "seed": opts.seed,
            "clock": {"M1": HOST, "M2": m2_clock},
        },
        per_mode={m.value: _mode_summary(rs) for m, rs in rounds.items()},
        m1=_milestone("M1", m1_checks, _m1_notes(measured)),
        m2=_milestone("M2", m2_checks, _m2_notes(auto_downgrades)),
        outputs_identical=all(measured.identical.values()),
        evidence=evidence,
        automatic_downgrades=auto_downgrades,
        notes=_run_notes(device, evidence),
    )


def _m1_notes(measured: _Rounds) -> list[str]:
    """Shown beside M1, never judged: on the device's clock, the chip runs the same jobs one at a time in both
    modes."""
    if not measured.device_clock:
        return []
    d50, d99 = measured.delta(ExecutorMode.ASYNC, 50, DEVICE), measured.delta(ExecutorMode.ASYNC, 99, DEVICE)
    return [
        f"on the device's clock (E2E without the chips' waits on the host) async(1) vs sync: P50 "
        f"{pct_text(d50.mean)}, P99 {pct_text(d99.mean)}: the chip runs the same jobs one at a time in both "
        "modes; M1's regression is the host's waiting and is judged on the host's clock"
    ]


def _m2_notes(auto_downgrades: Sequence[dict[str, Any]]) -> list[str]:
    notes = [
        "M2 also needs 24 h without errors before ping/pong is the default: run `calctl soak` with "
        "executor.mode pingpong; not assessed here"
    ]
    if auto_downgrades:
        notes.append(
            f"the downgrade monitor left ping/pong {len(auto_downgrades)} time(s) during the run "
            f"({', '.join(sorted({d['reason'] for d in auto_downgrades}))}): those rounds are not pure ping/pong"
        )
    return notes


def _run_notes(device: DeviceSpec, evidence: PingPongTraceEvidence) -> list[str]:
    notes = []
    if device.is_mock:
        notes.append(
            "MOCK RESULT: simulated timing; the phase split is an input of the mock, not a measurement of a board. "
            "It grades nothing on hardware: ping/pong on the board stays C1 (symbols present, not measured) and "
            "this executor C2 (built on confirmed interfaces, awaiting hardware acceptance) until this scenario "
            "runs with --device calrt (docs/runtime.md §5, 001 §1)."
        )
    if evidence.compute_overlap_s is None:
        notes.append(
            "the runtime reports no job phases: whether ping/pong computes overlapped is unknown, only "
            "two-in-flight time is shown"
        )
    return notes


def _e2e(rounds: Sequence[ModeRound], clock: str = HOST) -> np.ndarray:
    if clock == DEVICE:
        return np.asarray([x for rnd in rounds for x in rnd.device_e2e or () if x is not None], dtype=np.float64)
    return np.asarray([r.e2e for rnd in rounds for r in rnd.records if r.ok and r.e2e is not None], dtype=np.float64)


#: Why M1's regression is read on the host's clock only (said where a busy host leaves it undecided).
M1_HOST_TIME = (
    "async(1) differs from sync only in how the host waits for each job (the chip runs the same jobs one at a "
    "time in both modes), so the regression M1 bounds is host time and only the host's clock measures it"
)
#: Below this share of the ping/pong rounds' busy time with two jobs in flight, a busy host may have kept
#: ping/pong from overlapping at all: a gain not met then says so instead of failing the chip.
TWO_IN_FLIGHT_SHARE = 0.9


def _device_gain_on_busy_host(c: ModeCheck, ev: PingPongTraceEvidence, why: str, have_trace: bool) -> ModeCheck:
    """M2's device-clock gain on a saturated host: met stays met (the chips did overlap); not met stands only when
    two jobs were in flight nearly all the time (then ping/pong had its chance), else it is inconclusive naming
    how little the host kept in flight."""
    if c.passed is not False:
        return c
    share = ev.two_in_flight_s / ev.busy_s if have_trace and ev.busy_s > 0 else None
    if share is not None and share >= TWO_IN_FLIGHT_SHARE:
        return c
    kept = "unknown" if share is None else f"{share:.0%}"
    return dataclasses.replace(
        c,
        passed=None,
        detail=f"{c.detail}; inconclusive: {why}, and two jobs were in flight for {kept} of the ping/pong rounds' "
        f"busy time (under {TWO_IN_FLIGHT_SHARE:.0%}): the host may have left ping/pong nothing to overlap",
    )


def _mode_summary(rounds: Sequence[ModeRound]) -> dict[str, Any]:
    recs = [r for rnd in rounds for r in rnd.records]
    ok = [r for r in recs if r.ok]

    def pct(values: list[float]) -> dict[str, float | None]:
        p = percentiles(values)
        return {"p50": p.p50, "p99": p.p99, "mean": p.mean, "count": p.count}

    rates = [rnd.output_tokens / rnd.wall_s for rnd in rounds if rnd.wall_s > 0]
    return {
        "rounds": len(rounds),
        "requests": len(recs),
        "errors": len(recs) - len(ok),
        "e2e_s": pct([r.e2e for r in ok if r.e2e is not None]),
        "ttft_s": pct([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": pct([x for r in ok for x in r.itls()]),
        "throughput_tokens_per_s": bootstrap(rates).as_dict(),
        "round_wall_s": [round(rnd.wall_s, 6) for rnd in rounds],
    }


def _host_bound(c: ModeCheck, why: str) -> ModeCheck:
    """A host-clock check on a saturated host: inconclusive, saying so (never met or not met)."""
    return dataclasses.replace(c, passed=None, detail=f"{c.detail}; inconclusive: {why}")


def _bound(name: str, est: Estimate, limit: float, what: str, *, above: bool) -> ModeCheck:
    """``est`` against ``limit`` by the one decision rule: at least it (``above``) or at most it."""
    rule = f"{'>=' if above else '<='} {limit:+.0%}"
    if est.mean is None:
        return ModeCheck(name, rule, est, None, f"{what}: no measurement")
    text = f"{what}: {pct_text(est.mean)}" + (
        f" [95 % CI {pct_text(est.ci_low)}, {pct_text(est.ci_high)}]" if est.ci_low is not None else " (no CI)"
    )
    if est.ci_low is None or est.ci_high is None:
        return ModeCheck(name, rule, est, None, text + ": no interval, inconclusive")
    d = decide(est, limit, above=above)
    if d.passed is True:
        return ModeCheck(name, rule, est, True, text)
    if d.passed is False:
        return ModeCheck(name, rule, est, False, text + f": {'below' if above else 'beyond'} {limit:+.0%}")
    return ModeCheck(name, rule, est, None, text + f": the interval straddles {limit:+.0%} (n={est.n}), inconclusive")


def _at_most(name: str, est: Estimate, limit: float, what: str) -> ModeCheck:
    return _bound(name, est, limit, what, above=False)


def _at_least(name: str, est: Estimate, limit: float, what: str) -> ModeCheck:
    return _bound(name, est, limit, what, above=True)


def _milestone(name: str, checks: Sequence[ModeCheck], notes: Sequence[str] = ()) -> Milestone:
    if any(c.passed is False for c in checks):
        verdict = "not met"
    elif all(c.passed is True for c in checks):
        verdict = "met"
    else:
        verdict = "inconclusive"
    return Milestone(name, verdict, tuple(checks), tuple(notes))


def pct_text(x: float | None) -> str:
    """A relative change for people: ``+3.2 %`` (``n/a`` when there is none)."""
    return "n/a" if x is None else f"{x * 100:+.1f} %"


# -- trace evidence -----------------------------------------------------------------------------------


def trace_evidence(events: Sequence[TraceEvent]) -> PingPongTraceEvidence:
    """Overlaps on each chip among ``events`` (000 §14): two in flight, two computing, transfer vs compute."""
    jobs = [e for e in events if e.start_ns is not None and e.end_ns is not None]
    busy = inflight2 = 0.0
    compute2: float | None = 0.0
    transfer_compute: float | None = 0.0
    for chip in sorted({e.chip for e in jobs}):
        mine = [e for e in jobs if e.chip == chip]
        spans = [(e.start_ns, e.end_ns) for e in mine if e.start_ns is not None and e.end_ns is not None]
        busy += _covered(spans, 1)
        inflight2 += _covered(spans, 2)
        if any(e.phases is None for e in mine):
            compute2 = transfer_compute = None
            continue
        computes = [(p.start_ns, p.end_ns) for e in mine for p in e.phases or () if p.phase is JobPhase.COMPUTE]
        assert compute2 is not None and transfer_compute is not None
        compute2 += _covered(computes, 2)
        for e in mine:
            own = [(p.start_ns, p.end_ns) for p in e.phases or () if p.phase is not JobPhase.COMPUTE]
            others = [
                (p.start_ns, p.end_ns)
                for o in mine
                if o is not e
                for p in o.phases or ()
                if p.phase is JobPhase.COMPUTE
            ]
            transfer_compute += sum(_intersection(a, others) for a in own)
    return PingPongTraceEvidence(
        len(jobs),
        busy / 1e9,
        inflight2 / 1e9,
        None if compute2 is None else compute2 / 1e9,
        None if transfer_compute is None else transfer_compute / 1e9,
    )


def _covered(spans: Sequence[tuple[int, int]], depth: int) -> float:
    """Nanoseconds during which at least ``depth`` of ``spans`` are open."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    total, level, last = 0, 0, None
    for t, d in points:
        if last is not None and level >= depth:
            total += t - last
        level += d
        last = t
    return float(total)


def _intersection(span: tuple[int, int], others: Sequence[tuple[int, int]]) -> float:
    return float(sum(max(0, min(span[1], e) - max(span[0], s)) for s, e in others))
