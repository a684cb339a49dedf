"""Scenario ``executor-modes``: one workload under sync, async(1) and ping/pong, judged against M1 and M2 (000 §14, §19).

The serving engine runs in-process (default: the mock board) with
``executor.max_inflight: 2``; between rounds the scenario switches one alias's
executor mode with the operator action (:meth:`ModelWorker.set_executor_mode`),
so every mode serves the same loaded package, the same warmed engine and the
same workload. A round is ``concurrency`` identical greedy requests sent
together (``prompt_tokens`` in, ``output_tokens`` out, EOS ignored); rounds
rotate the mode order so drift does not favour one mode. After warm-up rounds,
per mode:

* request latency: end-to-end (judged), TTFT and inter-token latency (shown);
* aggregate throughput: output tokens / round wall time;
* errors and the generated tokens (every request must produce the sync
  baseline's tokens: "behaviour equivalent", M1).

Deltas against sync are paired by round and bootstrapped over rounds (seeded,
95 %). A check follows the one decision rule (:func:`calctl.checks.stats.decide`):
**met** when its whole interval is on the good side of the limit, **not met**
when its whole interval is on the bad side, otherwise **inconclusive** (never
a made-up pass). While a milestone is inconclusive after ``rounds``, the
scenario measures one more round of every mode at a time, up to
``max_rounds`` (default 3 x ``rounds``; ``calctl accept`` sets it per level):

=====  =====================================================  ============
M1     async(1): P50 E2E regression <= 3 %, P99 <= 5 %,        000 §19 M1
       same tokens, no errors
M2     ping/pong: aggregate throughput >= +10 %, P99 E2E       000 §19 M2
       regression <= 5 %, same tokens, no errors
=====  =====================================================  ============

Request E2E and round throughput are measured on the host's clock (what a
client waits, host work included). On a saturated host they describe the
host, not the executor on the chip: when the 1-minute load average exceeded
the CPU count during the measured rounds, the latency and throughput checks
are **inconclusive** ("host saturated: load average X on N CPUs"), whatever
their interval says, and no more rounds are run for them (more rounds on a
saturated host decide nothing). The load is recorded in ``options.host_load``.

M2 also asks for 24 h without errors before ping/pong becomes the default;
that is a soak (``calctl soak``), not this scenario, and the report says so.

The trace of the ping/pong rounds is evidence, not decoration (000 §14: two in
flight is not two computing): the report gives how long two jobs were in flight
together on the chip, how long one job's transfers overlapped the other's
compute, and how long two computes overlapped (the mock never lets them).

On the mock these are **mock results**: the phase split (how much of a job is
h2d/d2h that ping/pong can hide) is an input of the mock, not a property of a
board. The scenario therefore runs twice on the mock: with the transfer-heavy
split where overlap is possible (30 % h2d, 40 % compute, 30 % d2h) and with a
compute-bound control (0 / 100 / 0) where ping/pong can only hide host time,
so the gain is seen to come from the modelled phases and nothing else. Only
the first is judged; a mock result grades nothing on the board (ping/pong
stays C1 there, docs/runtime.md §5, 001 §1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calctl.checks import host
from calctl.checks.stats import Estimate, bootstrap, decide, percentiles
from calctl.errors import UsageError
from calctl.package.reader import load_manifest, package_root
from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioResult, Table
from calctl.runners.bench.gates import Gate
from calctl.runners.device import DeviceSpec
from calctl.runners.trace import TraceSlice, plot_timeline, trace_slices, write_chrome_trace
from calctl.runners.traffic import ClientPlan, EngineLoop, RequestRecord, TokenTap, drive_engine_request
from calctl.runtime import Runtime, TraceEvent, open_runtime
from calctl.runtime.mock.timing import TimingModel
from calctl.runtime.types import JobPhase
from calctl.serving.config import ExecutorConfig, ExecutorMode, default_scheduler_config
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.serving.protocol import GenerationRequest, SamplingParams
from calctl.signing.policy import TrustPolicy

Log = Callable[[str], None]

MODES = (ExecutorMode.SYNC, ExecutorMode.ASYNC, ExecutorMode.PINGPONG)
#: 000 §19 limits.
M1_P50_LIMIT = 0.03
M1_P99_LIMIT = 0.05
M2_GAIN_LIMIT = 0.10
M2_P99_LIMIT = 0.05
#: Default mock time scale: device time dominates host time (about 25 ms per decode job, ~1 ms of host work).
EXECUTOR_TIME_SCALE = 8.0


@dataclass(frozen=True)
class PhaseProfile:
    """The mock's h2d/compute/d2h split of every job (``GraphTiming.h2d_share``/``d2h_share``)."""

    name: str
    h2d_share: float
    d2h_share: float

    @property
    def compute_share(self) -> float:
        return 1.0 - self.h2d_share - self.d2h_share

    def label(self) -> str:
        return f"{self.name} ({self.h2d_share:.0%} h2d / {self.compute_share:.0%} compute / {self.d2h_share:.0%} d2h)"


TRANSFER_HEAVY = PhaseProfile("transfer-heavy", 0.3, 0.3)
COMPUTE_BOUND = PhaseProfile("compute-bound", 0.0, 0.0)


@dataclass(frozen=True)
class ExecutorModesOptions:
    package: Path
    trust: TrustPolicy
    alias: str | None = None  # default: the package's first model
    device: DeviceSpec = DeviceSpec()
    profile: PhaseProfile | None = TRANSFER_HEAVY  # mock only; None: the mock's own default split
    rounds: int = 8
    max_rounds: int | None = None  # round budget while a milestone is inconclusive (None: 3 x rounds)
    warmup_rounds: int = 1
    concurrency: int = 5  # odd: with B1 and deadline-first decode the P50 request is a middle one, not a boundary
    prompt_tokens: int = 16
    output_tokens: int = 6
    seed: int = 0
    request_timeout_s: float = 60.0
    trace_path: Path | None = None  # Chrome trace of the last ping/pong round (with phases)
    plot_path: Path | None = None  # its timeline picture

    def __post_init__(self) -> None:
        if self.rounds < 2:
            raise UsageError("executor-modes needs at least 2 measured rounds (a confidence interval needs two)")
        if self.concurrency < 2:
            raise UsageError(
                "executor-modes needs at least 2 concurrent requests: one request never has two jobs in flight"
            )
        if self.output_tokens < 2 or self.prompt_tokens < 1:
            raise UsageError("executor-modes needs prompt_tokens >= 1 and output_tokens >= 2")


@dataclass
class _Round:
    mode: ExecutorMode
    index: int
    start_ns: int
    wall_s: float
    records: list[RequestRecord]
    tokens: list[list[int]]

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens for r in self.records if r.ok)

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.records)


@dataclass(frozen=True)
class Check:
    name: str
    rule: str
    estimate: Estimate
    passed: bool | None  # None: inconclusive (the interval straddles the limit, or there is none)
    detail: str

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rule": self.rule,
            **self.estimate.as_dict(),
            "passed": self.passed,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Milestone:
    name: str
    verdict: str  # met | not met | inconclusive
    checks: tuple[Check, ...]
    notes: tuple[str, ...] = ()

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "checks": [c.document() for c in self.checks],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class TraceEvidence:
    """What the ping/pong rounds' per-chip trace shows (000 §14: shown, not assumed). Seconds."""

    jobs: int
    busy_s: float  # union of job intervals
    two_in_flight_s: float  # two jobs between start and end at once
    compute_overlap_s: float | None  # two computes at once (None: the runtime reports no phases)
    transfer_compute_overlap_s: float | None  # one job's h2d/d2h while another computes

    def document(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ExecutorModesReport:
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
    evidence: TraceEvidence
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


# -- running -------------------------------------------------------------------------------------------


def run_executor_modes(opts: ExecutorModesOptions, log: Log = lambda _: None) -> ExecutorModesReport:
    """Measure the three modes on one engine and judge M1/M2 (see the module docstring)."""
    device = opts.device.with_default_time_scale(EXECUTOR_TIME_SCALE)
    if not device.is_mock and opts.profile is not None:
        raise UsageError("a phase profile is a mock input; on a board the phases are what they are (use profile=None)")
    with package_root(opts.package) as root, _OpenDevice(device, opts.profile) as rt:
        pkg = load_manifest(root)
        alias = opts.alias or pkg.aliases[0]
        if alias not in pkg.aliases:
            raise UsageError(f"model {alias!r} is not in the package (it has {', '.join(pkg.aliases)})")
        vocab = pkg.model(alias).architecture.vocab_size
        # The ceiling is 2 in flight; the mode starts at sync and the rounds switch it (operator action).
        configs = {
            a: dataclasses.replace(
                default_scheduler_config(a, max_inflight=2), executor=ExecutorConfig(2, False, ExecutorMode.SYNC)
            )
            for a in pkg.aliases
        }
        sup = DeviceSupervisor(
            rt, trust=opts.trust, scheduler_configs=configs, options=SupervisorOptions(warmup_iterations=1)
        )
        try:
            log(
                f"  loading {opts.package} on the {device.kind.value} device"
                + (
                    f" (time scale {device.time_scale:g}, {opts.profile.label()})"
                    if device.is_mock and opts.profile
                    else ""
                )
            )
            sup.start(root)
            engine = ServingEngine(sup)
            worker = sup.cores[alias]
            rng = np.random.default_rng(opts.seed)
            prompt = tuple(int(t) for t in rng.integers(3, vocab, size=opts.prompt_tokens))
            rounds: dict[ExecutorMode, list[_Round]] = {m: [] for m in MODES}
            auto_downgrades: list[dict[str, Any]] = []
            budget = max(opts.rounds, opts.max_rounds if opts.max_rounds is not None else 3 * opts.rounds)
            host_load: list[float] = []

            def undecided(r: int) -> bool:
                done = r - opts.warmup_rounds
                if done < opts.rounds:
                    return True
                if done >= budget:
                    return False
                if host.saturated(host_load):
                    return False  # more rounds on a saturated host decide nothing
                rep = _judge(opts, device, alias, rounds, [], auto_downgrades, host_load)
                return "inconclusive" in (rep.m1.verdict, rep.m2.verdict)

            with EngineLoop("executor-modes") as loop:
                r = -1
                while undecided(r + 1):
                    r += 1
                    measured = r >= opts.warmup_rounds
                    for mode in MODES[r % 3 :] + MODES[: r % 3]:  # rotate the order: no mode always runs first
                        before = len(worker.downgrades())
                        outcome = worker.set_executor_mode(mode)
                        if not outcome["ok"]:
                            raise UsageError(f"executor mode {mode.value}: {outcome.get('detail')}")
                        rnd = loop.submit(_round(engine, alias, mode, r, prompt, opts)).result(
                            opts.request_timeout_s + 30
                        )
                        new = worker.downgrades()[before:]
                        if new:  # the monitor left ping/pong during the round: say so, never hide it
                            auto_downgrades.extend({**d.as_dict(), "round": r} for d in new)
                        if measured:
                            rounds[mode].append(rnd)
                            host_load.append(host.load_now())
                    if measured:
                        done = r - opts.warmup_rounds + 1
                        log(
                            f"  round {done}/{opts.rounds}"
                            + (f" (+{done - opts.rounds}, budget {budget})" if done > opts.rounds else "")
                            + ": "
                            + ", ".join(f"{m.value} {rounds[m][-1].wall_s * 1e3:.0f} ms" for m in MODES)
                        )
            events = _round_trace(rt, rounds[ExecutorMode.PINGPONG], worker.chips, alias)
            last = _round_trace(rt, rounds[ExecutorMode.PINGPONG][-1:], worker.chips, alias)
            last_sync = _round_trace(rt, rounds[ExecutorMode.SYNC][-1:], worker.chips, alias)
            chips = tuple(worker.chips)
        finally:
            sup.shutdown(5.0)
    report = _judge(opts, device, alias, rounds, events, auto_downgrades, host_load)
    if opts.trace_path is not None or opts.plot_path is not None:
        slices = trace_slices(last, phases=True)
        meta = {
            "scenario": "executor-modes",
            "mode": "pingpong",
            "mock_result": device.is_mock,
            "phase_profile": opts.profile.label() if opts.profile else None,
        }
        if opts.trace_path is not None:
            write_chrome_trace(opts.trace_path, slices, device=device.kind.value, metadata=meta)
            report.trace_path = opts.trace_path
        if opts.plot_path is not None:
            title = f"executor-modes: {alias}, the last sync round against the last ping/pong round" + (
                f", {opts.profile.label()}" if opts.profile else ""
            )
            plot_timeline(
                opts.plot_path,
                [*slices, *_aligned(trace_slices(last_sync, phases=True), rounds, "sync round")],
                title=title,
                device=device.kind.value,
                chips=chips,
                lane_names={"ping": " ping/pong round: ping engine", "pong": " ping/pong round: pong engine"},
                notes=_plot_notes(report),
            )
            report.plot_path = opts.plot_path
    return report


def _aligned(slices: list[TraceSlice], rounds: dict[ExecutorMode, list[_Round]], lane: str) -> list[TraceSlice]:
    """The last sync round's slices on a lane of their own, shifted to start where the last ping/pong round did."""
    sync, pp = rounds[ExecutorMode.SYNC], rounds[ExecutorMode.PINGPONG]
    if not sync or not pp:
        return []
    shift = (pp[-1].start_ns - sync[-1].start_ns) / 1e9
    return [dataclasses.replace(s, engine=lane, start=s.start + shift, end=s.end + shift) for s in slices]


def _plot_notes(report: ExecutorModesReport) -> list[str]:
    """The figures the picture illustrates, with their CIs (they were only in the JSON)."""
    lines = []
    for m in (report.m1, report.m2):
        for c in m.checks:
            e = c.estimate
            ci = (
                f" [95 % CI {e.ci_low:+.1%}, {e.ci_high:+.1%}]"
                if e.ci_low is not None and e.ci_high is not None
                else ""
            )
            exact = c.rule.startswith("==")  # a count or an equality, not a relative change
            mean = "n/a" if e.mean is None else (f"{e.mean:g}" if exact else f"{e.mean:+.1%}")
            verdict = {True: "PASS", False: "FAIL", None: "NOT JUDGED"}[c.passed]
            lines.append(f"{m.name} {c.name}: {mean}{ci} ({c.rule}) -> {verdict}")
    return lines


class _OpenDevice:
    """Open the device; on the mock, with the profile's phase split."""

    def __init__(self, device: DeviceSpec, profile: PhaseProfile | None) -> None:
        self.device, self.profile = device, profile
        self.rt: Runtime | None = None

    def __enter__(self) -> Runtime:
        d = self.device
        if d.is_mock and self.profile is not None:
            options: dict[str, Any] = {
                "timing": TimingModel().with_shares(self.profile.h2d_share, self.profile.d2h_share),
                "serialize_chips": d.serialize_chips,
            }
            if d.time_scale is not None:
                options["time_scale"] = d.time_scale
            if d.fault_plan is not None:
                options["fault_plan"] = d.fault_plan
            if d.seed is not None:
                options["seed"] = d.seed
            self.rt = open_runtime("mock", **options)
        else:
            self.rt = d.open()
        return self.rt

    def __exit__(self, *exc: object) -> None:
        if self.rt is not None:
            self.rt.close()


async def _round(
    engine: ServingEngine,
    alias: str,
    mode: ExecutorMode,
    index: int,
    prompt: tuple[int, ...],
    opts: ExecutorModesOptions,
) -> _Round:
    taps: dict[str, TokenTap] = {}

    def submit(req: GenerationRequest) -> TokenTap:
        tap = TokenTap(engine.submit(req))
        taps[req.request_id] = tap
        return tap

    reqs = [
        GenerationRequest(
            f"xm-{index}-{mode.value}-{i}",
            alias,
            "executor-modes",
            prompt,
            opts.output_tokens,
            SamplingParams(temperature=0.0),
            ignore_eos=True,
        )
        for i in range(opts.concurrency)
    ]
    start_ns = time.monotonic_ns()
    t0 = time.monotonic()
    results = await asyncio.gather(
        *(drive_engine_request(submit, r, ClientPlan("executor-modes"), timeout_s=opts.request_timeout_s) for r in reqs)
    )
    wall = time.monotonic() - t0
    tokens = [taps[r.request_id].tokens if r.request_id in taps else [] for r in reqs]
    return _Round(mode, index, start_ns, wall, [res.record for res in results], tokens)


def _round_trace(rt: Runtime, rounds: Sequence[_Round], chips: Sequence[int], alias: str) -> list[TraceEvent]:
    if not rounds:
        return []
    spans = [(r.start_ns, r.start_ns + int(r.wall_s * 1e9)) for r in rounds]
    events = rt.trace(since_ns=spans[0][0])
    return [
        e for e in events if e.model == alias and e.chip in chips and any(lo <= e.submit_ns <= hi for lo, hi in spans)
    ]


# -- judging ------------------------------------------------------------------------------------------


def _judge(
    opts: ExecutorModesOptions,
    device: DeviceSpec,
    alias: str,
    rounds: dict[ExecutorMode, list[_Round]],
    events: Sequence[TraceEvent],
    auto_downgrades: list[dict[str, Any]],
    host_load: Sequence[float] = (),
) -> ExecutorModesReport:
    base = rounds[ExecutorMode.SYNC]
    reference = next((t for r in base for t, rec in zip(r.tokens, r.records, strict=True) if rec.ok), None)
    identical = {
        m: all(rec.ok and t == reference for r in rs for t, rec in zip(r.tokens, r.records, strict=True))
        for m, rs in rounds.items()
    }
    per_mode = {m.value: _mode_summary(rs) for m, rs in rounds.items()}
    n = len(base)
    seed = opts.seed

    def delta(mode: ExecutorMode, q: float) -> Estimate:
        other = rounds[mode]

        def stat(idx: np.ndarray) -> float:
            rows = idx.astype(int)
            a = _e2e([other[i] for i in rows])
            b = _e2e([base[i] for i in rows])
            return float(np.percentile(a, q) / np.percentile(b, q) - 1) if len(a) and len(b) else float("nan")

        return bootstrap(list(range(n)), stat, seed=seed)

    def gain(mode: ExecutorMode) -> Estimate:
        other = rounds[mode]

        def stat(idx: np.ndarray) -> float:
            rows = idx.astype(int)
            tm = sum(other[i].output_tokens for i in rows) / sum(other[i].wall_s for i in rows)
            tb = sum(base[i].output_tokens for i in rows) / sum(base[i].wall_s for i in rows)
            return float(tm / tb - 1)

        return bootstrap(list(range(n)), stat, seed=seed)

    def sanity(mode: ExecutorMode) -> list[Check]:
        errors = sum(r.errors for r in rounds[mode])
        out = [
            Check(
                "errors",
                "== 0",
                Estimate(float(errors), None, None, sum(len(r.records) for r in rounds[mode])),
                errors == 0,
                f"{errors} request(s) did not finish normally",
            )
        ]
        out.append(
            Check(
                "same_tokens",
                "== sync",
                Estimate(1.0 if identical[mode] else 0.0, None, None, 1),
                identical[mode],
                "every request produced the sync baseline's tokens"
                if identical[mode]
                else "some request's tokens differ from the sync baseline: not equivalent",
            )
        )
        return out

    m1_checks = [
        _at_most("p50_e2e_regression", delta(ExecutorMode.ASYNC, 50), M1_P50_LIMIT, "async P50 E2E vs sync"),
        _at_most("p99_e2e_regression", delta(ExecutorMode.ASYNC, 99), M1_P99_LIMIT, "async P99 E2E vs sync"),
        *sanity(ExecutorMode.ASYNC),
    ]
    m2_checks = [
        _at_least(
            "throughput_gain", gain(ExecutorMode.PINGPONG), M2_GAIN_LIMIT, "ping/pong aggregate tokens/s vs sync"
        ),
        _at_most("p99_e2e_regression", delta(ExecutorMode.PINGPONG, 99), M2_P99_LIMIT, "ping/pong P99 E2E vs sync"),
        *sanity(ExecutorMode.PINGPONG),
    ]
    if host.saturated(host_load):
        why = host.saturation_note(host_load, "the rounds")
        m1_checks[:2] = [_host_bound(c, why) for c in m1_checks[:2]]
        m2_checks[:2] = [_host_bound(c, why) for c in m2_checks[:2]]
    evidence = trace_evidence(events)
    m2_notes = [
        "M2 also needs 24 h without errors before ping/pong is the default: run `calctl soak` with "
        "executor.mode pingpong; not assessed here"
    ]
    if auto_downgrades:
        m2_notes.append(
            f"the downgrade monitor left ping/pong {len(auto_downgrades)} time(s) during the run "
            f"({', '.join(sorted({d['reason'] for d in auto_downgrades}))}): those rounds are not pure ping/pong"
        )
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
    return ExecutorModesReport(
        device=device.kind.value,
        mock=device.is_mock,
        alias=alias,
        profile=opts.profile if device.is_mock else None,
        time_scale=device.time_scale if device.is_mock else None,
        options={
            "rounds": opts.rounds,
            "rounds_run": n,
            "host_load": [round(x, 2) for x in host_load],
            "warmup_rounds": opts.warmup_rounds,
            "concurrency": opts.concurrency,
            "prompt_tokens": opts.prompt_tokens,
            "output_tokens": opts.output_tokens,
            "seed": opts.seed,
        },
        per_mode=per_mode,
        m1=_milestone("M1", m1_checks),
        m2=_milestone("M2", m2_checks, m2_notes),
        outputs_identical=all(identical.values()),
        evidence=evidence,
        automatic_downgrades=auto_downgrades,
        notes=notes,
    )


def _e2e(rounds: Sequence[_Round]) -> np.ndarray:
    return np.asarray([r.e2e for rnd in rounds for r in rnd.records if r.ok and r.e2e is not None], dtype=np.float64)


def _mode_summary(rounds: Sequence[_Round]) -> dict[str, Any]:
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


def _host_bound(c: Check, why: str) -> Check:
    """A host-clock check on a saturated host: inconclusive, saying so (never met or not met)."""
    return dataclasses.replace(c, passed=None, detail=f"{c.detail}; inconclusive: {why}")


def _at_most(name: str, est: Estimate, limit: float, what: str) -> Check:
    rule = f"<= {limit:+.0%}"
    if est.mean is None:
        return Check(name, rule, est, None, f"{what}: no measurement")
    text = f"{what}: {_pct(est.mean)}" + (
        f" [95 % CI {_pct(est.ci_low)}, {_pct(est.ci_high)}]" if est.ci_low is not None else " (no CI)"
    )
    if est.ci_low is None or est.ci_high is None:
        return Check(name, rule, est, None, text + ": no interval, inconclusive")
    d = decide(est, limit, above=False)
    if d.passed is True:
        return Check(name, rule, est, True, text)
    if d.passed is False:
        return Check(name, rule, est, False, text + f": beyond {limit:+.0%}")
    return Check(name, rule, est, None, text + f": the interval straddles {limit:+.0%} (n={est.n}), inconclusive")


def _at_least(name: str, est: Estimate, limit: float, what: str) -> Check:
    rule = f">= {limit:+.0%}"
    if est.mean is None:
        return Check(name, rule, est, None, f"{what}: no measurement")
    text = f"{what}: {_pct(est.mean)}" + (
        f" [95 % CI {_pct(est.ci_low)}, {_pct(est.ci_high)}]" if est.ci_low is not None else " (no CI)"
    )
    if est.ci_low is None or est.ci_high is None:
        return Check(name, rule, est, None, text + ": no interval, inconclusive")
    d = decide(est, limit, above=True)
    if d.passed is True:
        return Check(name, rule, est, True, text)
    if d.passed is False:
        return Check(name, rule, est, False, text + f": below {limit:+.0%}")
    return Check(name, rule, est, None, text + f": the interval straddles {limit:+.0%} (n={est.n}), inconclusive")


def _milestone(name: str, checks: Sequence[Check], notes: Sequence[str] = ()) -> Milestone:
    if any(c.passed is False for c in checks):
        verdict = "not met"
    elif all(c.passed is True for c in checks):
        verdict = "met"
    else:
        verdict = "inconclusive"
    return Milestone(name, verdict, tuple(checks), tuple(notes))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} %"


# -- trace evidence -----------------------------------------------------------------------------------


def trace_evidence(events: Sequence[TraceEvent]) -> TraceEvidence:
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
    return TraceEvidence(
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


# -- the bench scenario --------------------------------------------------------------------------------


def run_scenario(options: BenchOptions, log: Log) -> ScenarioResult:
    """``calctl bench --scenario executor-modes``: judged transfer-heavy run, plus the compute-bound control on the mock."""
    if options.package is None or options.trust is None:
        raise UsageError(
            "--scenario executor-modes runs the engine in-process: it needs a package (PKG) and a trust policy"
        )
    if len(options.models) > 1:
        raise UsageError("--scenario executor-modes measures one model: give at most one --models alias")
    device = options.device or DeviceSpec()
    alias = options.models[0] if options.models else None
    runs: list[ExecutorModesReport] = []
    profiles: tuple[PhaseProfile | None, ...] = (TRANSFER_HEAVY, COMPUTE_BOUND) if device.is_mock else (None,)
    for i, profile in enumerate(profiles):
        log(
            f"executor-modes: {profile.label() if profile else 'device phases'}"
            + (" (control, not judged)" if i else "")
        )
        out = options.out_dir
        runs.append(
            run_executor_modes(
                ExecutorModesOptions(
                    options.package,
                    options.trust,
                    alias=alias,
                    device=device,
                    profile=profile,
                    seed=options.seed,
                    **({"rounds": options.rounds} if options.rounds is not None else {}),
                    # only the judged profile measures on while a milestone is inconclusive; the control does not
                    **({"max_rounds": options.max_rounds} if i == 0 and options.max_rounds is not None else {}),
                    **({} if i == 0 else {"max_rounds": 0}),
                    trace_path=out / f"executor-modes-{profile.name if profile else 'device'}.trace.json",
                    plot_path=out / f"executor-modes-{profile.name if profile else 'device'}.png" if i == 0 else None,
                ),
                log,
            )
        )
    judged = runs[0]
    gates = tuple(
        Gate(f"{m.name}.{c.name}", c.rule, c.estimate.mean, c.passed, c.detail)
        for m in (judged.m1, judged.m2)
        for c in m.checks
    )
    verdicts = (judged.m1.verdict, judged.m2.verdict)
    verdict = "FAIL" if "not met" in verdicts else ("PASS" if all(v == "met" for v in verdicts) else "MEASURED")
    tables = [_modes_table(r) for r in runs] + [_evidence_table(runs)]
    notes = [
        f"M1 {judged.m1.verdict}, M2 {judged.m2.verdict}" + (f" ({judged.profile.label()})" if judged.profile else "")
    ]
    notes += list(judged.m2.notes) + judged.notes
    if len(runs) > 1:
        control = runs[1]
        notes.append(
            f"control {control.profile.label() if control.profile else ''}: M2 {control.m2.verdict}; "
            f"throughput gain {_pct(control.m2.checks[0].estimate.mean)}: with no transfer to hide, ping/pong "
            "hides only host time"
        )
    return ScenarioResult(
        scenario="executor-modes",
        verdict=verdict,
        exit_code=1 if verdict == "FAIL" else 0,
        gates=gates,
        tables=tuple(tables),
        body={"runs": [r.document() for r in runs]},
        plot=judged.plot_path,
        notes=tuple(notes),
        mock_result=device.is_mock,
    )


def _modes_table(r: ExecutorModesReport) -> Table:
    rows = []
    for mode, s in r.per_mode.items():
        tp = s["throughput_tokens_per_s"]
        rows.append(
            (
                mode,
                s["requests"],
                s["errors"],
                _ms(s["e2e_s"]["p50"]),
                _ms(s["e2e_s"]["p99"]),
                _ms(s["ttft_s"]["p99"]),
                _ms(s["itl_s"]["p99"]),
                f"{tp['mean']:.1f} [{tp['ci_low'] or 0:.1f}, {tp['ci_high'] or 0:.1f}]"
                if tp["mean"] is not None
                else "n/a",
            )
        )
    title = (
        f"executor modes, {r.alias}" + (f", {r.profile.label()}" if r.profile else "") + (" (MOCK)" if r.mock else "")
    )
    return Table(
        title,
        ("mode", "requests", "errors", "P50 E2E", "P99 E2E", "P99 TTFT", "P99 ITL", "tokens/s [95 % CI]"),
        tuple(rows),
    )


def _evidence_table(runs: Sequence[ExecutorModesReport]) -> Table:
    rows = []
    for r in runs:
        e = r.evidence
        rows.append(
            (
                r.profile.name if r.profile else r.device,
                e.jobs,
                f"{e.busy_s:.3f}",
                f"{e.two_in_flight_s:.3f}",
                "n/a" if e.compute_overlap_s is None else f"{e.compute_overlap_s:.3f}",
                "n/a" if e.transfer_compute_overlap_s is None else f"{e.transfer_compute_overlap_s:.3f}",
            )
        )
    return Table(
        "ping/pong trace: two in flight is not two computing (seconds)",
        ("profile", "jobs", "busy", "two in flight", "two computing", "transfer || compute"),
        tuple(rows),
    )


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


EXECUTOR_MODES = Scenario(
    "executor-modes",
    "sync vs async(1) vs ping/pong on one engine in-process; M1/M2 of 000 §19 with CIs and trace evidence",
    run_scenario,
    needs_url=False,
    options=("PKG", "--models", "--time-scale", "--seed"),
)

__all__ = [
    "COMPUTE_BOUND",
    "EXECUTOR_MODES",
    "TRANSFER_HEAVY",
    "ExecutorModesOptions",
    "ExecutorModesReport",
    "PhaseProfile",
    "run_executor_modes",
    "run_scenario",
    "trace_evidence",
]
