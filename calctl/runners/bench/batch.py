"""Scenario ``batch``: the M3 evidence for continuous batching, per decode profile (000 §7, §8, §19 M3).

000 §19 M3: every lane correct, fill ratio / throughput / P99 measured against
the project's targets, and no continuous-batching claim without that data.
The serving engine runs in-process (default: the mock board) once per decode
profile: B1 first, as the reference, then each compiled profile of B4/B8/B16.
A run allows the scheduler exactly one compiled profile (the scheduler
config's ``batch.profiles``), so every decode job of the B8 run is a B8 job and
its inactive lanes are padding (000 §7.3, §8).

The load is closed loop: as many clients as the profile has lanes, each
sending its next request as soon as the last one finished, until the run's
requests (``REQUESTS_PER_LANE`` per lane of the largest profile, the same set
for every profile) are served. Every request is greedy (temperature 0) with
its own prompt (seeded) and a fixed output length (EOS ignored), so its tokens
depend on nothing but the model: the same request served at B1 and at B16 must
produce the same tokens (000 §7.4: inactive lanes must not disturb active
ones). Per profile the report gives:

* fill ratio: active lanes / compiled batch, mean over the run's decode jobs
  (the engine's ``calctl_batch_fill_ratio`` histogram), and the padding lanes;
* throughput: output tokens / wall time of the run;
* P50/P99 TPOT and E2E with their sample counts; a P99 over fewer than
  :data:`~calctl.runners.bench.gates.MIN_SAMPLES` ``p99`` samples is shown
  but NOT JUDGED (there is no project target to judge it against yet either);
* ``lanes_match_b1``: every request's tokens equal the B1 reference's. Any
  mismatch FAILs, naming the request and the profile.

On the mock these are **mock results**: the timing model decides what a lane
costs, so the throughput gain says nothing about a board (docs/runtime.md §5).
The lane check is real on either device: it compares what the device computed.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calctl.checks import host
from calctl.checks.stats import bootstrap, percentiles
from calctl.errors import UsageError
from calctl.loadgen.client import RequestRecord
from calctl.package.reader import load_manifest, package_root
from calctl.runners.bench.base import (
    BenchOptions,
    OneModelOptions,
    Scenario,
    ScenarioInterrupted,
    ScenarioResult,
    Table,
    interrupted_note,
    ms_cell,
)
from calctl.runners.bench.batch_fault import KvFaultPhase, run_kv_fault
from calctl.runners.bench.gates import MIN_SAMPLES, NOT_JUDGED, Gate, verdict
from calctl.runners.device import DeviceSpec
from calctl.runners.plotting import device_label, pyplot, save
from calctl.runners.serving_stack import ServingStack
from calctl.runners.traffic import ClientPlan, TappedSubmit, drive_engine_request
from calctl.runtime.interface import FaultInjecting
from calctl.runtime.intervals import union
from calctl.runtime.mock.faults import FaultRule
from calctl.runtime.types import TraceEvent
from calctl.serving.config import BatchConfig, SchedulerConfig, default_scheduler_config
from calctl.serving.engine import ServingEngine, SupervisorOptions
from calctl.serving.protocol import GenerationRequest, SamplingParams

Log = Callable[[str], None]

#: The profiles M3 asks for beyond the B1 reference (000 §8).
BATCH_PROFILES = (4, 8, 16)
#: Requests per lane of the largest profile measured: the request set every profile serves.
REQUESTS_PER_LANE = 4
#: Default mock time scale: device time dominates host time, as in executor-modes.
BATCH_TIME_SCALE = 4.0


@dataclass(frozen=True)
class BatchOptions(OneModelOptions):
    profiles: tuple[int, ...] | None = None  # default: every compiled one of BATCH_PROFILES
    requests_per_lane: int = REQUESTS_PER_LANE
    prompt_tokens: tuple[int, int] = (8, 32)  # uniform, inclusive
    output_tokens: int = 16
    seed: int = 0
    request_timeout_s: float = 60.0
    inject: FaultRule | None = None  # mock only: armed once each batched (B>1) run is Ready, e.g. corrupt_output
    kv_fault: bool = True  # the KV-fault phase at the first batched profile (mock; batch_fault.py)
    plot_path: Path | None = None

    def __post_init__(self) -> None:
        if self.requests_per_lane < 1:
            raise UsageError(f"batch: requests_per_lane {self.requests_per_lane}: expected at least 1")
        if self.output_tokens < 2:
            raise UsageError(f"batch: output_tokens {self.output_tokens}: expected at least 2 (TPOT needs two)")
        lo, hi = self.prompt_tokens
        if not 1 <= lo <= hi:
            raise UsageError(f"batch: prompt_tokens {lo}..{hi}: expected 1 <= low <= high")


@dataclass
class ProfileRun:
    batch: int
    wall_s: float
    records: dict[str, RequestRecord]  # request id -> its record
    tokens: dict[str, list[int]]
    fill_sum: float
    decode_jobs: int
    padding_lanes: int
    mismatches: list[str] = field(default_factory=list)
    busy: list[tuple[int, int]] | None = None  # the union of the alias's job intervals, ns (None: unstamped)
    host_load: tuple[float, ...] = ()  # the host's 1-minute load average at the run's start and end

    @property
    def device_busy_s(self) -> float | None:
        return sum(b - a for a, b in self.busy) / 1e9 if self.busy else None

    @property
    def itl(self) -> list[float]:
        """Every gap between two tokens a client received (inter-token latency, host clock), over the served
        requests."""
        return [
            b - a for r in self.records.values() if r.ok for a, b in zip(r.token_times, r.token_times[1:], strict=False)
        ]

    @property
    def device_itl(self) -> list[float] | None:
        """The same gaps on the device's clock: the time the chip was busy between the two tokens (its jobs'
        stamps), so a host that left the chip waiting does not lengthen them. None when a job was unstamped."""
        busy = self.busy
        if not busy:
            return None
        starts = [a for a, _ in busy]
        done = np.concatenate(([0], np.cumsum([b - a for a, b in busy])))  # busy ns before span i

        def busy_until(t_ns: int) -> int:
            i = bisect.bisect_right(starts, t_ns) - 1
            return 0 if i < 0 else int(done[i]) + min(t_ns, busy[i][1]) - busy[i][0]

        return [
            (busy_until(int(b * 1e9)) - busy_until(int(a * 1e9))) / 1e9
            for r in self.records.values()
            if r.ok
            for a, b in zip(r.token_times, r.token_times[1:], strict=False)
        ]

    @property
    def fill_ratio(self) -> float | None:
        return self.fill_sum / self.decode_jobs if self.decode_jobs else None

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens for r in self.records.values() if r.ok)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records.values() if not r.ok)

    @property
    def throughput(self) -> float | None:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def device_throughput(self) -> float | None:
        """Output tokens per second the chip was busy with the run's jobs (device clock; None: unstamped)."""
        return self.output_tokens / self.device_busy_s if self.device_busy_s else None

    def summary(self) -> dict[str, Any]:
        tpot = percentiles([r.tpot for r in self.records.values() if r.ok and r.tpot is not None])
        e2e = percentiles([r.e2e for r in self.records.values() if r.ok and r.e2e is not None])
        itl = percentiles(self.itl)
        return {
            "profile": f"B{self.batch}",
            "batch": self.batch,
            "clients": self.batch,
            "requests": len(self.records),
            "errors": self.errors,
            "wall_s": round(self.wall_s, 4),
            "decode_jobs": self.decode_jobs,
            "fill_ratio": self.fill_ratio,
            "padding_lanes": self.padding_lanes,
            "output_tokens": self.output_tokens,
            "throughput_tokens_per_s": self.throughput,
            "device_busy_s": self.device_busy_s,
            "throughput_device_tokens_per_s": self.device_throughput,
            "tpot_s": _pct_doc(tpot),
            "itl_s": _pct_doc(itl),
            "e2e_s": _pct_doc(e2e),
            "p99_judged": e2e.count >= MIN_SAMPLES["p99"],
            "lanes_match_b1": not self.mismatches,
            "mismatches": self.mismatches,
        }


@dataclass
class BatchResult:
    alias: str
    device: str
    mock: bool
    runs: list[ProfileRun]
    skipped: list[str]
    package: str = ""
    device_options: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    plot_path: Path | None = None
    kv_fault: KvFaultPhase | None = None

    @property
    def reference(self) -> ProfileRun:
        return self.runs[0]


def _pct_doc(p: Any) -> dict[str, Any]:
    return {"n": p.count, "p50": p.p50, "p99": p.p99, "mean": p.mean}


async def _closed_loop(
    engine: ServingEngine, requests: Sequence[GenerationRequest], clients: int, timeout_s: float
) -> tuple[dict[str, RequestRecord], dict[str, list[int]]]:
    submit = TappedSubmit(engine.submit)
    queue = list(reversed(requests))
    records: dict[str, RequestRecord] = {}

    async def client() -> None:
        while queue:
            req = queue.pop()
            res = await drive_engine_request(submit, req, ClientPlan("batch"), timeout_s=timeout_s)
            records[req.request_id] = res.record

    await asyncio.gather(*(client() for _ in range(clients)))
    return records, {rid: tap.tokens for rid, tap in submit.taps.items()}


def _config(alias: str, batch: int, requests: int) -> SchedulerConfig:
    """The scheduler allowed exactly one compiled profile, B``batch``: every decode job is a B``batch`` job."""
    config = default_scheduler_config(alias, max_waiting_requests=max(128, requests))
    return dataclasses.replace(config, batch=BatchConfig((batch,), 0))


def _busy(events: Sequence[TraceEvent]) -> list[tuple[int, int]] | None:
    """When the chip was busy with ``events`` (the union of their intervals, ns); None when one is unstamped."""
    spans = [(e.start_ns, e.end_ns) for e in events if e.start_ns and e.end_ns and e.end_ns >= e.start_ns]
    if not spans or len(spans) != len(events):
        return None
    return union(spans)


def _serve(
    opts: BatchOptions, device: DeviceSpec, alias: str, batch: int, requests: Sequence[GenerationRequest], log: Log
) -> ProfileRun:
    config = _config(alias, batch, len(requests))
    with device.open() as rt:
        with ServingStack(
            rt,
            trust=opts.trust,
            name=f"batch-b{batch}",
            scheduler_configs={alias: config},
            options=SupervisorOptions(warmup_iterations=1),
        ) as stack:
            stack.start(opts.package)
            if opts.inject is not None and batch > 1:  # after golden + warm-up: the fault hits served lanes
                if not isinstance(rt, FaultInjecting):
                    raise UsageError("batch: a fault can be injected only on a board that injects faults (the mock)")
                rt.arm_fault(opts.inject)
            before = stack.batch_counters(alias)
            start_ns = time.monotonic_ns()
            load0 = host.load_now()
            t0 = time.monotonic()
            records, tokens = stack.loop.submit(
                _closed_loop(stack.engine, requests, batch, opts.request_timeout_s)
            ).result(opts.request_timeout_s * len(requests) + 30)
            wall = time.monotonic() - t0
            seen = stack.batch_counters(alias) - before
            run = ProfileRun(batch, wall, records, tokens, seen.fill_ratio_sum, seen.decode_jobs, seen.lane_waste)
            run.busy = _busy([e for e in rt.trace(since_ns=start_ns) if e.model == alias])
            run.host_load = (load0, host.load_now())
    return run


def _log_profile(run: ProfileRun, log: Log) -> None:
    """One line per served profile, once it is kept (a signal after the line finds it in the report)."""
    log(
        f"  B{run.batch}: {len(run.records)} requests in {run.wall_s:.2f} s, "
        f"fill {run.fill_ratio if run.fill_ratio is not None else float('nan'):.2f}, "
        f"{run.throughput or 0:.0f} tokens/s"
    )


def run_batch(opts: BatchOptions, log: Log = lambda _: None) -> BatchResult:
    """Serve the same request set at B1 and at each batched profile; compare every request's tokens."""
    device = opts.device.with_default_time_scale(BATCH_TIME_SCALE)
    if opts.inject is not None and not device.is_mock:
        raise UsageError("batch: a fault can be injected only on the mock board")
    with package_root(opts.package) as root:
        pkg = load_manifest(root)
        alias = opts.alias or pkg.aliases[0]
        if alias not in pkg.aliases:
            raise UsageError(f"--models {alias}: the package's models are {', '.join(pkg.aliases)}")
        model = pkg.model(alias)
        compiled = tuple(model.decode.batch_profiles)
        vocab = model.architecture.vocab_size
    wanted = opts.profiles if opts.profiles is not None else BATCH_PROFILES
    bad = [b for b in wanted if b not in BATCH_PROFILES]
    if bad:
        raise UsageError(f"batch: profiles {bad}: expected any of {', '.join(f'B{b}' for b in BATCH_PROFILES)}")
    profiles = [b for b in wanted if b in compiled]
    skipped = [f"B{b}" for b in wanted if b not in compiled]
    if not profiles:
        raise UsageError(
            f"{opts.package}: model {alias!r} compiles decode profiles {', '.join(f'B{b}' for b in compiled)}; "
            "--scenario batch needs at least one of B4, B8, B16 (calctl sample-package --profiles 1,4,8,16)"
        )
    if 1 not in compiled:
        raise UsageError(f"{opts.package}: model {alias!r} has no B1 decode profile, the reference of every lane")
    rng = np.random.default_rng(opts.seed)
    n = opts.requests_per_lane * max(profiles)
    lo, hi = opts.prompt_tokens
    requests = [
        GenerationRequest(
            f"batch-{i}",
            alias,
            "batch",
            tuple(int(t) for t in rng.integers(3, vocab, size=int(rng.integers(lo, hi + 1)))),
            opts.output_tokens,
            SamplingParams(temperature=0.0),
            ignore_eos=True,
        )
        for i in range(n)
    ]
    log(
        f"  {n} greedy requests, {lo}..{hi} prompt tokens, {opts.output_tokens} output tokens; profiles B1 (reference), "
        + ", ".join(f"B{b}" for b in profiles)
    )
    runs: list[ProfileRun] = []
    running = "B1"
    kv_fault: KvFaultPhase | None = None

    def result_of(runs: list[ProfileRun]) -> BatchResult:
        result = BatchResult(
            alias,
            device.kind.value,
            device.is_mock,
            runs,
            skipped,
            package=str(opts.package),
            device_options=device.describe(),
            workload={
                "requests": n,
                "clients": "one per lane of the profile (closed loop)",
                "prompt_tokens": [lo, hi],
                "output_tokens": opts.output_tokens,
                "temperature": 0.0,
                "seed": opts.seed,
            },
            kv_fault=kv_fault,
        )
        if opts.plot_path is not None:
            plot_batch(opts.plot_path, result)
            result.plot_path = opts.plot_path
        return result

    try:
        runs.append(_serve(opts, device, alias, 1, requests, log))
        running = ""  # between profiles: the one just logged is finished
        _log_profile(runs[-1], log)
        for b in profiles:
            running = f"B{b}"
            run = _serve(opts, device, alias, b, requests, log)
            run.mismatches = _compare(runs[0], run, requests)
            runs.append(run)
            running = ""
            _log_profile(run, log)
        if opts.kv_fault:
            running = f"the KV fault at B{profiles[0]}"
            kv_fault = run_kv_fault(
                package=opts.package,
                trust=opts.trust,
                device=device,
                alias=alias,
                batch=profiles[0],
                config=_config(alias, profiles[0], len(requests)),
                prompts=requests,
                reference=runs[0].tokens,
                timeout_s=opts.request_timeout_s,
                log=log,
            )
            running = ""
            log(f"  KV fault at B{profiles[0]}: {kv_fault.summary()}")
    except KeyboardInterrupt as exc:  # SIGINT/SIGTERM mid-profile: the finished profiles and their picture stay
        if not runs:
            raise
        done = scenario_result(result_of(runs))
        note = interrupted_note(exc, running, [f"B{r.batch}" for r in runs])
        partial = dataclasses.replace(
            done,
            verdict="INTERRUPTED",
            gates=(),
            body={**done.body, "interrupted_in": running or None, "phases_finished": [f"B{r.batch}" for r in runs]},
            notes=(note, *(x for x in done.notes if not x.startswith("failing gate"))),
        )
        raise ScenarioInterrupted(exc, partial) from exc
    return result_of(runs)


def _compare(ref: ProfileRun, run: ProfileRun, requests: Sequence[GenerationRequest]) -> list[str]:
    """Every request's tokens at B{run.batch} against B1: one line per mismatching request."""
    ok_ref = {rid for rid, r in ref.records.items() if r.ok}
    ok_run = {rid for rid, r in run.records.items() if r.ok}
    out = []
    for req in requests:
        rid = req.request_id
        if rid not in ok_ref:
            out.append(f"{rid}: failed at the B1 reference, nothing to compare")
            continue
        if rid not in ok_run:
            out.append(f"{rid}: failed at B{run.batch}")
            continue
        a, b = ref.tokens.get(rid, []), run.tokens.get(rid, [])
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            out.append(
                f"{rid}: B{run.batch} differs from B1 at output token {at} "
                f"(B1 {a[at] if at < len(a) else 'end'}, B{run.batch} {b[at] if at < len(b) else 'end'})"
            )
    return out


def plot_batch(path: Path, result: BatchResult) -> None:
    """Fill ratio, throughput and P99 TPOT/E2E per profile, one panel each."""
    plt = pyplot()
    docs = [r.summary() for r in result.runs]
    labels = [d["profile"] for d in docs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    colours = ["#7f7f7f"] + ["#2ca02c" if d["lanes_match_b1"] else "#d62728" for d in docs[1:]]
    axes[0].bar(labels, [d["fill_ratio"] or 0.0 for d in docs], color=colours)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("fill ratio (active lanes / compiled batch)")
    axes[1].bar(labels, [d["throughput_tokens_per_s"] or 0.0 for d in docs], color=colours)
    axes[1].set_ylabel("output tokens/s")
    x = np.arange(len(docs))
    for off, key, name in ((-0.2, "tpot_s", "P99 TPOT"), (0.2, "e2e_s", "P99 E2E")):
        axes[2].bar(x + off, [(d[key]["p99"] or 0.0) * 1e3 for d in docs], 0.4, label=name)
    axes[2].set_xticks(x, [f"{d['profile']}\nn={d['e2e_s']['n']}" for d in docs])
    axes[2].set_ylabel("ms (P99 below 100 samples: not judged)")
    axes[2].legend()
    bad = [d["profile"] for d in docs[1:] if not d["lanes_match_b1"]]
    fig.suptitle(
        f"calctl bench batch: {result.alias}; lanes vs B1: "
        + (f"MISMATCH at {', '.join(bad)}" if bad else "all match")
        + f"\n{device_label(result.device)}",
        fontsize=10,
    )
    save(fig, path)


def run_scenario(options: BenchOptions, log: Log) -> ScenarioResult:
    """``calctl bench --scenario batch``."""
    if options.trust is None:
        raise UsageError("--scenario batch runs the engine in-process: it needs a trust policy")
    if len(options.models) > 1:
        raise UsageError("--scenario batch measures one model: give at most one --models alias")
    device = options.device or DeviceSpec()
    package = options.package
    if package is None:
        package = build_batch_sample(options.out_dir / "batch-sample-package", seed=options.seed)
        log(f"  built the sample package {package} (single, decode profiles B1/B4/B8/B16, test key)")
    result = run_batch(
        BatchOptions(
            package,
            options.trust,
            alias=options.models[0] if options.models else None,
            device=device,
            seed=options.seed,
            request_timeout_s=options.request_timeout_s,
            plot_path=options.out_dir / "bench.png",
        ),
        log,
    )
    return scenario_result(result)


def build_batch_sample(out: Path, *, seed: int = 0) -> Path:
    """A sealed single-model sample with decode profiles B1/B4/B8/B16, signed with the published test key."""
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private
    from calctl.signing.policy import test_key_paths

    out.parent.mkdir(parents=True, exist_ok=True)
    return build_sample(
        out, kind="single", key=load_private(test_key_paths()[0]), seed=seed, decode_profiles=(1, *BATCH_PROFILES)
    )


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99))


def _vs_b1(result: BatchResult, docs: list[dict[str, Any]]) -> None:
    """Each profile's figures against B1's, what M3 judges against the project's targets (docs/accept.md):
    the throughput gain and the P99 inter-token latency with its bootstrap interval (seeded), both on the
    device's clock when every profile's jobs were stamped (tokens per chip-busy second; the chip-busy time
    between two tokens), else on the host's."""
    ref = result.reference
    device = all(r.busy for r in result.runs)  # one clock for every profile: the device's when all were stamped
    for run, d in zip(result.runs, docs, strict=True):
        itl = (run.device_itl if device else None) or run.itl
        d["itl_p99_s"] = {**bootstrap(itl, _p99).as_dict(), "clock": "device" if device else "host"} if itl else None
        d["host_load"] = list(run.host_load)
        if run is ref:
            continue
        mine, base = (run.device_throughput, ref.device_throughput) if device else (run.throughput, ref.throughput)
        d["gain_vs_b1"] = {
            "clock": "device" if device else "host",
            "gain": mine / base if mine is not None and base else None,
            "host_gain": run.throughput / ref.throughput if run.throughput and ref.throughput else None,
        }


def scenario_result(result: BatchResult) -> ScenarioResult:
    docs = [r.summary() for r in result.runs]
    _vs_b1(result, docs)
    gates = []
    for run in result.runs[1:]:
        gates.append(
            Gate(
                f"B{run.batch}.lanes_match_b1",
                "every request's tokens equal the same request's at B1 (000 §19 M3)",
                float(len(run.mismatches)),
                not run.mismatches,
                f"{len(run.records) - len(run.mismatches)}/{len(run.records)} requests match B1"
                + (f"; first: {run.mismatches[0]}" if run.mismatches else ""),
                samples=len(run.records),
            )
        )
    kv = result.kv_fault
    if kv is not None and kv.measured:
        gates.append(
            Gate(
                f"{kv.profile}.kv_fault_recovered",
                "a CCU fault in a batched decode job: its lanes end device_error, the engine recovers, later "
                "requests are served as at B1, the KV is back to rest (000 §7.4, §9.2, §18, §19 M3)",
                float(len(kv.problems)),
                not kv.problems,
                kv.summary(),
            )
        )
    v = verdict(gates)
    rows = []
    for d in docs:
        judged = d["p99_judged"]
        rows.append(
            (
                d["profile"],
                d["requests"],
                d["errors"],
                "n/a" if d["fill_ratio"] is None else f"{d['fill_ratio']:.2f}",
                d["padding_lanes"],
                "n/a" if d["throughput_tokens_per_s"] is None else f"{d['throughput_tokens_per_s']:.0f}",
                ms_cell(d["tpot_s"]["p50"]),
                ms_cell(d["tpot_s"]["p99"]) + ("" if judged else f" ({NOT_JUDGED}, n={d['tpot_s']['n']})"),
                ms_cell(d["e2e_s"]["p99"]) + ("" if judged else f" ({NOT_JUDGED}, n={d['e2e_s']['n']})"),
                "reference" if d["batch"] == 1 else ("yes" if d["lanes_match_b1"] else f"NO ({len(d['mismatches'])})"),
            )
        )
    table = Table(
        f"batch profiles, {result.alias}" + (" (MOCK)" if result.mock else ""),
        (
            "profile",
            "requests",
            "errors",
            "fill ratio",
            "padding lanes",
            "tokens/s",
            "P50 TPOT",
            "P99 TPOT",
            "P99 E2E",
            "matches B1",
        ),
        tuple(rows),
    )
    notes = []
    for run in result.runs[1:]:
        notes += [f"failing gate B{run.batch}.lanes_match_b1: {m}" for m in run.mismatches[:10]]
        if len(run.mismatches) > 10:
            notes.append(f"failing gate B{run.batch}.lanes_match_b1: and {len(run.mismatches) - 10} more")
    if kv is not None:
        notes.append(f"KV fault at {kv.profile or 'a batched profile'}: {kv.summary()}")
    if result.skipped:
        notes.append(f"not compiled in the package, not measured: {', '.join(result.skipped)}")
    if any(not d["p99_judged"] for d in docs):
        notes.append(
            f"P99 over fewer than {MIN_SAMPLES['p99']} requests is shown, not judged; "
            "fill ratio, tokens/s and P99 are graded against the project's targets by `calctl accept --targets` "
            "(000 §19 M3), not here"
        )
    if result.mock:
        notes.append(
            "MOCK RESULT: the timing model decides what a lane costs; the lane check compares what the mock "
            "computed, the throughput says nothing about a board (docs/runtime.md §5)"
        )
    return ScenarioResult(
        scenario="batch",
        verdict=v,
        gates=tuple(gates),
        tables=(table,),
        body={
            "alias": result.alias,
            "package": result.package,
            "device_options": result.device_options,
            "workload": result.workload,
            "profiles": docs,
            "skipped_profiles": result.skipped,
            "kv_fault": kv.to_dict() if kv is not None else None,
        },
        plot=result.plot_path,
        notes=tuple(notes),
        mock_result=result.mock,
    )


BATCH = Scenario(
    "batch",
    "B1 reference then B4/B8/B16 in-process, closed loop: fill ratio, tokens/s, P99, lanes vs B1 (000 §19 M3)",
    run_scenario,
    needs_url=False,
    options=("PKG", "--models", "--time-scale", "--seed", "--request-timeout"),
    default_package=None,  # the bundled samples are B1 only: the scenario builds a B1/B4/B8/B16 sample
)

__all__ = ["BATCH", "BATCH_PROFILES", "BatchOptions", "BatchResult", "ProfileRun", "run_batch", "run_scenario"]
