"""Scenario ``executor-modes``, the run: one engine in-process, its executor mode switched between rounds (the
operator action), rounds measured until M1 and M2 are decided or the round budget is spent."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from calctl.checks import host
from calctl.errors import UsageError
from calctl.package.reader import load_manifest, package_root
from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioResult
from calctl.runners.bench.executor_modes.judge import ExecutorModesResult, judge
from calctl.runners.bench.executor_modes.plan import (
    COMPUTE_BOUND,
    EXECUTOR_TIME_SCALE,
    MODES,
    TRANSFER_HEAVY,
    ExecutorModesOptions,
    Log,
    ModeRound,
    PhaseProfile,
)
from calctl.runners.bench.executor_modes.render import plot_notes, scenario_result
from calctl.runners.device import DeviceSpec
from calctl.runners.serving_stack import ServingStack
from calctl.runners.trace import TraceSlice, plot_timeline, trace_slices, write_chrome_trace
from calctl.runners.traffic import ClientPlan, TappedSubmit, drive_engine_request
from calctl.runtime import Runtime, TraceEvent, open_runtime
from calctl.runtime.intervals import intersections, union
from calctl.runtime.mock.timing import TimingModel
from calctl.serving.config import ExecutorConfig, ExecutorMode, default_scheduler_config
from calctl.serving.engine import ServingEngine, SupervisorOptions
from calctl.serving.protocol import GenerationRequest, SamplingParams


def run_executor_modes(opts: ExecutorModesOptions, log: Log = lambda _: None) -> ExecutorModesResult:
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
        with ServingStack(
            rt,
            trust=opts.trust,
            name="executor-modes",
            scheduler_configs=configs,
            options=SupervisorOptions(warmup_iterations=1),
        ) as stack:
            log(
                f"  loading {opts.package} on the {device.kind.value} device"
                + (
                    f" (time scale {device.time_scale:g}, {opts.profile.label()})"
                    if device.is_mock and opts.profile
                    else ""
                )
            )
            stack.start(root)
            engine = stack.engine
            core = stack.core(alias)  # the model's EngineCore
            rng = np.random.default_rng(opts.seed)
            prompt = tuple(int(t) for t in rng.integers(3, vocab, size=opts.prompt_tokens))
            rounds: dict[ExecutorMode, list[ModeRound]] = {m: [] for m in MODES}
            auto_downgrades: list[dict[str, Any]] = []
            budget = max(opts.rounds, opts.max_rounds if opts.max_rounds is not None else 3 * opts.rounds)
            host_load: list[float] = []

            def undecided(r: int) -> bool:
                done = r - opts.warmup_rounds
                if done < opts.rounds:
                    return True
                if done >= budget:
                    return False
                rep = judge(opts, device, alias, rounds, [], auto_downgrades, host_load)
                if host.saturated(host_load):
                    # more rounds on a saturated host decide nothing on its clock; M2 on the device's may be decided
                    return rep.options["clock"]["M2"] == "device" and rep.m2.verdict == "inconclusive"
                return "inconclusive" in (rep.m1.verdict, rep.m2.verdict)

            loop = stack.loop
            r = -1
            while undecided(r + 1):
                r += 1
                measured = r >= opts.warmup_rounds
                for mode in MODES[r % 3 :] + MODES[: r % 3]:  # rotate the order: no mode always runs first
                    before = len(core.downgrades())
                    outcome = core.set_executor_mode(mode)
                    if not outcome["ok"]:
                        raise UsageError(f"executor mode {mode.value}: {outcome.get('detail')}")
                    rnd = loop.submit(_round(engine, alias, mode, r, prompt, opts)).result(opts.request_timeout_s + 30)
                    on_device_clock(rnd, _round_trace(rt, [rnd], core.chips, alias))
                    # the monitor left ping/pong during the round: say so, never hide it
                    auto_downgrades.extend({**d.as_dict(), "round": r} for d in core.downgrades()[before:])
                    if measured:
                        rounds[mode].append(rnd)
                        host_load.append(host.load_now())
                if measured:
                    log(_round_line(r - opts.warmup_rounds + 1, opts.rounds, budget, rounds))
            events = _round_trace(rt, rounds[ExecutorMode.PINGPONG], core.chips, alias)
            last = _round_trace(rt, rounds[ExecutorMode.PINGPONG][-1:], core.chips, alias)
            last_sync = _round_trace(rt, rounds[ExecutorMode.SYNC][-1:], core.chips, alias)
            chips = tuple(core.chips)
    result = judge(opts, device, alias, rounds, events, auto_downgrades, host_load)
    _write_evidence(opts, device, alias, result, (last, last_sync), rounds, chips)
    return result


def _round_line(done: int, wanted: int, budget: int, rounds: dict[ExecutorMode, list[ModeRound]]) -> str:
    """``  round 3/5: sync 120 ms, async 80 ms, pingpong 70 ms`` (with the rounds beyond the wanted ones)."""
    extra = f" (+{done - wanted}, budget {budget})" if done > wanted else ""
    return f"  round {done}/{wanted}{extra}: " + ", ".join(
        f"{m.value} {rounds[m][-1].wall_s * 1e3:.0f} ms" for m in MODES
    )


def _write_evidence(
    opts: ExecutorModesOptions,
    device: DeviceSpec,
    alias: str,
    result: ExecutorModesResult,
    last_rounds: tuple[list[TraceEvent], list[TraceEvent]],
    rounds: dict[ExecutorMode, list[ModeRound]],
    chips: tuple[int, ...],
) -> None:
    """The Chrome trace of the last ping/pong round and the picture of it against the last sync round, where
    ``opts`` asks for them (their paths are set on ``result``)."""
    if opts.trace_path is None and opts.plot_path is None:
        return
    last, last_sync = last_rounds
    slices = trace_slices(last, phases=True)
    meta = {
        "scenario": "executor-modes",
        "mode": "pingpong",
        "mock_result": device.is_mock,
        "phase_profile": opts.profile.label() if opts.profile else None,
    }
    if opts.trace_path is not None:
        write_chrome_trace(opts.trace_path, slices, device=device.kind.value, metadata=meta)
        result.trace_path = opts.trace_path
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
            notes=plot_notes(result),
        )
        result.plot_path = opts.plot_path


def _aligned(slices: list[TraceSlice], rounds: dict[ExecutorMode, list[ModeRound]], lane: str) -> list[TraceSlice]:
    """The last sync round's slices on a lane of their own, shifted to start where the last ping/pong round did."""
    sync, pp = rounds[ExecutorMode.SYNC], rounds[ExecutorMode.PINGPONG]
    if not sync or not pp:
        return []
    shift = (pp[-1].start_ns - sync[-1].start_ns) / 1e9
    return [dataclasses.replace(s, engine=lane, start=s.start + shift, end=s.end + shift) for s in slices]


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
) -> ModeRound:
    submit = TappedSubmit(engine.submit)
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
    tokens = [submit.tokens(r.request_id) for r in reqs]
    return ModeRound(mode, index, start_ns, wall, [res.record for res in results], tokens)


def on_device_clock(rnd: ModeRound, events: Sequence[TraceEvent]) -> None:
    """Fill ``rnd``'s device-clock figures from its jobs' stamps (left None when a job has none)."""
    spans = [(e.start_ns, e.end_ns) for e in events if e.start_ns and e.end_ns and e.end_ns >= e.start_ns]
    if not spans or len(spans) != len(events):
        return
    busy = union(spans)
    rnd.device_busy_s = sum(b - a for a, b in busy) / 1e9
    per_request: list[float | None] = []
    for rec in rnd.records:
        if not rec.ok or rec.e2e is None:
            per_request.append(None)
            continue
        end = rec.end if rec.end is not None else rec.sent + rec.e2e  # time.monotonic(): the stamps' clock
        window = [(rnd.start_ns, int(end * 1e9))]
        per_request.append(sum(b - a for a, b in intersections(busy, window)) / 1e9)
    rnd.device_e2e = per_request


def _round_trace(rt: Runtime, rounds: Sequence[ModeRound], chips: Sequence[int], alias: str) -> list[TraceEvent]:
    if not rounds:
        return []
    spans = [(r.start_ns, r.start_ns + int(r.wall_s * 1e9)) for r in rounds]
    events = rt.trace(since_ns=spans[0][0])
    return [
        e for e in events if e.model == alias and e.chip in chips and any(lo <= e.submit_ns <= hi for lo, hi in spans)
    ]


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
    runs: list[ExecutorModesResult] = []
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
    return scenario_result(runs, mock=device.is_mock)


EXECUTOR_MODES = Scenario(
    "executor-modes",
    "sync vs async(1) vs ping/pong on one engine in-process; M1/M2 of 000 §19 with CIs and trace evidence",
    run_scenario,
    needs_url=False,
    options=("PKG", "--models", "--time-scale", "--seed"),
)
