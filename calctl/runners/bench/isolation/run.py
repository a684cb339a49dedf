"""G2 isolation, the run: the replica served in-process, serially then concurrently, and what it left behind.

:class:`_IsolationRun` opens the device, loads the replica through the engine's own load gate, serves each
golden prompt alone, then the planned workload in a closed loop, and records what the checks read into an
:class:`~calctl.runners.bench.isolation.judge.Observation` (per-side KV and memory before and after, the trace,
the recoveries, the faults that fired). ``judge.py`` judges it, ``render.py`` writes the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calctl.errors import CheckFailed, UsageError
from calctl.package.reader import load_manifest, package_root
from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioResult
from calctl.runners.bench.isolation.judge import IsolationReference, Judged, Observation, judge_run
from calctl.runners.bench.isolation.plan import (
    G2_MIN_REQUESTS,
    ISOLATION_TIME_SCALE,
    Planned,
    check_replica,
    golden_case,
    in_flight,
    load_gate_failure,
    plan_workload,
)
from calctl.runners.bench.isolation.render import device_text, scenario_result
from calctl.runners.bench.kv_at_rest import KvAtRest
from calctl.runners.device import DeviceSpec
from calctl.runners.serving_stack import ServingStack
from calctl.runners.traffic import ClientPlan, EngineLoop, EngineResult, TappedSubmit, TokenTap, drive_engine_request
from calctl.runtime.errors import RuntimeLayerError
from calctl.runtime.interface import FaultInjecting
from calctl.serving.config import default_scheduler_config
from calctl.serving.engine import ServingEngine, SupervisorOptions
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.protocol import GenerationRequest, SamplingParams
from calctl.serving.record_sink import RECORDS_FILE, RecordSink
from calctl.signing.policy import TrustPolicy

Log = Callable[[str], None]
Golden = dict[str, tuple[tuple[int, ...], list[int]]]


# ---------------------------------------------------------------------------
# What the device and the engine hold, read before and after the run


def _memory(rt: Any) -> dict[int, int | None]:
    try:
        return {m.chip: m.used_bytes for m in rt.memory_usage()}
    except RuntimeLayerError:
        return {}


# How long the run waits, after its traffic, for the aliases to settle: a recovery after a fault (reset, golden,
# warm-up: 001 §11.3) on a loaded 2-core host has taken over 30 s.
SETTLE_TIMEOUT_S = 180.0


# ---------------------------------------------------------------------------
# The run


class _IsolationRun:
    """One run: the device opened, the replica loaded and served; what it saw goes into :attr:`obs`."""

    def __init__(self, opts: BenchOptions, log: Log, obs: Observation) -> None:
        self.log = log
        self.obs = obs
        self.taps: dict[str, TokenTap] = {}
        self.timeout = max(60.0, opts.request_timeout_s)

    def on_device(self, package: Path, trust: TrustPolicy, sink: RecordSink, golden: Golden) -> None:
        """Open the device, start the supervisor (its load gate is the first serial golden), serve, shut down."""
        obs, device = self.obs, self.obs.device
        with device.open() as rt:
            obs.versions = rt.versions()
            with ServingStack(
                rt,
                trust=trust,
                name="isolation",
                scheduler_configs={
                    s.alias: default_scheduler_config(s.alias, max_waiting_requests=max(128, len(obs.work)))
                    for s in obs.replica.sides
                },
                options=SupervisorOptions(warmup_iterations=1),
                metrics=EngineMetrics(records=sink),
                engine_type=ServingEngine,
            ) as stack:
                self.log(
                    f"  loading {package} on {device_text(device, obs.versions)}"
                    + (f" (time scale {device.time_scale:g})" if device.is_mock else "")
                )
                try:
                    t_load = time.monotonic()
                    stack.start(package)  # golden + warm-up of A0 then A1 before Ready (001 §11.1)
                    obs.seconds["load_golden_warmup"] = time.monotonic() - t_load
                except CheckFailed as exc:
                    # Only the load gate's golden/warm-up is this scenario's verdict; a package that fails
                    # validation, the budget or the device fit is the CLI's error (exit 1, its own message).
                    if not load_gate_failure(exc.message, obs.replica):
                        raise
                    obs.start_error = exc.message
                    self.log(f"  serial golden failed at load: {exc.message}")
                if obs.start_error is None:
                    self._serve(stack, golden)

    def _serve(self, stack: ServingStack, golden: Golden) -> None:
        obs, sup, rt = self.obs, stack.sup, stack.rt
        obs.generations = {a: {g} for a, g in stack.generations().items()}
        recoveries0 = len(sup.recoveries)
        since = time.monotonic_ns()

        submit = TappedSubmit(stack.engine.submit)
        self.taps = submit.taps
        loop = stack.loop
        t_golden = time.monotonic()
        self._serial_golden(loop, submit, golden)
        stack.wait_settled(SETTLE_TIMEOUT_S)
        obs.seconds["serial_golden"] = time.monotonic() - t_golden
        obs.before = {s.alias: KvAtRest.read(stack, s.alias) for s in obs.replica.sides}
        obs.mem_before = _memory(rt)
        results = self._concurrent(loop, submit)
        # A fault's recovery (reset, golden, warm-up) ends before the KV and the recoveries are read.
        obs.drained = stack.wait_settled(SETTLE_TIMEOUT_S)
        self._after(stack, since, recoveries0)
        obs.judged = [
            Judged(
                p,
                r,
                self.taps[p.request_id].tokens if p.request_id in self.taps else [],
                frozenset(obs.generations[p.side.alias]),
            )
            for p, r in zip(obs.work, results, strict=True)
        ]
        self.log(f"  served in {obs.wall_s:.1f} s; judging against the package reference")

    def _serial_golden(self, loop: EngineLoop, submit: Callable[[GenerationRequest], TokenTap], golden: Golden) -> None:
        """001 §12 Phase 2 step 2: each alias's golden prompt through the engine alone, one side then the other."""
        for side in self.obs.replica.sides:
            prompt, want = golden[side.alias]
            req = GenerationRequest(
                f"iso-golden-{side.alias}",
                side.alias,
                "isolation",
                prompt,
                len(want),
                SamplingParams(temperature=0.0),
                ignore_eos=True,
            )
            res = loop.submit(
                drive_engine_request(submit, req, ClientPlan("isolation-golden"), timeout_s=self.timeout)
            ).result(self.timeout + 10)
            got = self.taps[req.request_id].tokens if req.request_id in self.taps else []
            ok = res.record.ok and got == want
            at = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), None)
            self.obs.golden_rows.append(
                {
                    "alias": side.alias,
                    "chip": side.chip,
                    "load_gate": "passed",
                    "served_ok": ok,
                    "expected_tokens": want,
                    "got_tokens": got,
                    "first_mismatch": at if at is not None else (None if ok else min(len(want), len(got))),
                    "outcome": res.record.outcome.value,
                }
            )
            self.log(f"  serial golden {side.alias} (chip {side.chip}): {'ok' if ok else 'MISMATCH'}")

    def _concurrent(self, loop: EngineLoop, submit: Callable[[GenerationRequest], TokenTap]) -> list[EngineResult]:
        """001 §12 Phase 2 step 3: the workload in a closed loop, :func:`in_flight` requests per alias at a time."""
        obs, timeout = self.obs, self.timeout
        obs.in_flight = {s.alias: in_flight(s) for s in obs.replica.sides}
        self.log(
            f"  {len(obs.work)} requests over {', '.join(s.alias for s in obs.replica.sides)} in a closed loop "
            f"({', '.join(f'{a}: {n} in flight' for a, n in obs.in_flight.items())}; deadline {timeout:g} s "
            f"from admission), {sum(1 for p in obs.work if p.cancel)} of them cancelled on a cue"
        )

        async def everything() -> list[EngineResult]:
            slots = {a: asyncio.Semaphore(n) for a, n in obs.in_flight.items()}

            async def one(p: Planned) -> EngineResult:
                async with slots[p.side.alias]:
                    return await drive_engine_request(
                        submit, p.request(), p.plan(), timeout_s=timeout, from_admission=True
                    )

            return await asyncio.gather(*(one(p) for p in obs.work))

        t0 = time.monotonic()
        # closed loop: each slot serves its share one request after another, each within its own deadline
        per_slot = max(1, -(-len(obs.work) // max(1, sum(obs.in_flight.values()))))
        results = loop.submit(everything()).result((timeout + 10) * per_slot + 30)
        obs.wall_s = time.monotonic() - t0
        obs.seconds["serve"] = obs.wall_s
        return results

    def _after(self, stack: ServingStack, since: int, recoveries0: int) -> None:
        """What the run left: generations after any reset, KV and memory, the trace, the faults that fired."""
        obs, sup, rt = self.obs, stack.sup, stack.rt
        # A reset during the run (a fault) republishes the aliases under a new generation: those count as theirs.
        for rec in sup.recoveries[recoveries0:]:
            obs.recoveries.append(
                {
                    "alias": rec.alias,
                    "reason": rec.reason,
                    "scope": rec.scope,
                    "ok": rec.ok,
                    "generations": rec.generations,
                }
            )
            for alias, gen in rec.generations.items():
                obs.generations.setdefault(alias, set()).add(gen)
        for alias, gen in stack.generations().items():
            obs.generations[alias].add(gen)
        obs.after = {s.alias: KvAtRest.read(stack, s.alias) for s in obs.replica.sides}
        obs.mem_after = _memory(rt)
        with contextlib.suppress(RuntimeLayerError):
            obs.events = rt.trace(since_ns=since)
        if isinstance(rt, FaultInjecting):  # the mock says which faults of the plan fired
            obs.faults_fired = [
                {"kind": f.kind.value, "graph": f.graph, "model": f.model, "chips": list(f.chips), "job": f.job}
                for f in rt.injected_faults()
            ]


def run_isolation(options: BenchOptions, log: Log) -> ScenarioResult:
    """``calctl bench --scenario isolation``: plan, run, judge, render."""
    opts = options
    if opts.requests < 1:
        raise UsageError(f"--requests {opts.requests}: expected at least 1 (001 §13.1 asks for {G2_MIN_REQUESTS})")
    if opts.package is None or opts.trust is None:
        raise UsageError("--scenario isolation needs a replica package (PKG) and a trust policy")
    if opts.models:
        raise UsageError("--scenario isolation serves both aliases of the replica: --models does not apply")
    device = (opts.device or DeviceSpec()).with_default_time_scale(ISOLATION_TIME_SCALE)
    with package_root(opts.package) as root:
        pkg = load_manifest(root)
        replica = check_replica(pkg, root, opts.package)
        refs = {s.alias: IsolationReference(pkg, root, s.alias) for s in replica.sides}
        golden = {s.alias: golden_case(pkg, root, s.alias) for s in replica.sides}
        arch = pkg.model(replica.sides[0].alias).architecture
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    work = plan_workload(opts.requests, replica, vocab=arch.vocab_size, context=arch.context_limit, seed=opts.seed)
    obs = Observation(replica, device, work)
    records_dir = opts.out_dir / "records"
    sink = RecordSink.to_directory(records_dir)
    obs.files["records_ndjson"] = str(records_dir / RECORDS_FILE)
    try:
        _IsolationRun(opts, log, obs).on_device(opts.package, opts.trust, sink, golden)
    finally:
        sink.close()
    t_judge = time.monotonic()
    return scenario_result(opts, obs, judge_run(obs, refs), t_judge=t_judge)


ISOLATION = Scenario(
    "isolation",
    "G2 replica isolation in-process: serial golden, then 1,000 concurrent requests over A0/A1 with cancellations, "
    "every output against the package reference, records, trace and KV checked (001 §12 Phase 2, §13.1)",
    run_isolation,
    needs_url=False,
    options=("PKG", "--requests", "--seed", "--time-scale", "--fault-plan", "--request-timeout"),
    default_package="replica",  # G2 needs a replica
)
