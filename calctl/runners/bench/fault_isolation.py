"""Scenario ``fault-isolation``: the F0/F1/F2 grade from injected faults on A while B is measured (001 §12 Phase 4, §13.4).

The serving engine runs in-process on the **mock** board (faults are armed at
run time with ``MockRuntime.arm_fault``; a board needs the vendor's own fault
injection, so ``--device calrt`` is refused). B gets a steady closed-loop load
(two clients, fixed 16-token prompts and 16-token greedy outputs) from start to
end; its success and end-to-end latency are measured per phase. Phases, in
order (each at least :data:`PHASE_MIN_S`, longer while B has had fewer device jobs than a P99 needs, up to
:data:`PHASE_MAX_S` on a loaded host, then until both models are Ready):

==================  =========================================================  ==================
phase               what happens to A                                          class (001 §11.3)
==================  =========================================================  ==================
baseline            light traffic, no fault: B's reference latency             –
invalid-tensor      prompts longer than the context and empty prompts: 400    request
kv-exhausted        48 concurrent requests against 16 KV lanes + 4 waiting:  resource
                    429 beyond capacity
submit-busy         DeviceBusy on A's decode submits: 3 (retried) and then 7   resource
                    in a row (more than the bounded backoff allows)
wait-timeout        one A decode job hangs; the worker's job timeout fires     runtime
ccu-exception       one A decode job ends in a CCU exception                   runtime
drain-deadline      A reloads while long requests run, drain deadline 0.1 s    lifecycle
unload-reload       A reloads normally (drain completes)                       lifecycle
==================  =========================================================  ==================

A fault plan on the board (``DeviceSpec.fault_plan``, ``--fault-plan`` of
``calctl accept``) is armed by the board as it is: its rules fire at their own
ordinals, counted from the board's open, in whatever phase that is (the
``faults_fired`` of each phase shows where). Its ``wait_timeout`` and
``ccu_exception`` rules also say how far such a fault reaches on this board:
the wait-timeout and ccu-exception phases arm their fault with the plan's
``reset_scope`` for that kind (default chip), so a plan whose CCU fault takes
the whole board makes the ccu-exception phase a board-wide fault.

Per phase the evidence row holds: what A saw (outcomes by class), the recovery
scope the runtime granted (from the supervisor's recovery records: chip reset
of A's chip, board reset, or none) and which aliases it touched, and whether
**B was impacted**: any B request failed or was refused, B left Ready, or B's
P99 job latency **on the device's clock** (each B job's ``end - submit`` from
the runtime's own stamps: its queueing on the device plus its run) exceeded
its baseline P99 by more than 25 % (the 001 §13.2 tail gate). That gate
follows the one decision rule (:func:`calctl.checks.stats.decide`): judged
only from at least :data:`calctl.runners.bench.gates.MIN_SAMPLES` ``p99``
jobs in the baseline and in the phase, impacted when the bootstrap CI of the
phase's P99 lies above the gate, not impacted when it lies at or below, else
not judged. B's end-to-end latency on the host (what its clients waited,
host overhead included) is reported beside it and never decides the grade: a
starved host is not a fault domain of the board. A phase whose latency could
not be judged and whose class could still lower the grade makes the verdict
**NOT JUDGED** (exit 0), naming the phase and its sample counts.

Grade, from observation only (001 §13.4):

* **F0** – a request- or resource-level fault on A (invalid, KV exhausted,
  submit busy) impacted B;
* **F1** – those were isolated, but a runtime fault (timeout, CCU) or a
  lifecycle action (drain deadline, unload/reload) impacted B;
* **F2** – nothing on A impacted B.

A combined calbin reconfigures as a whole (001 §11.2): reloading A drains and
reloads B too, which the lifecycle rows show, so a combined package grades F1
at best. On the mock these are mock results: they show the tool and the
engine's isolation logic, not a board's fault domains (docs/runtime.md §5).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calctl.checks.stats import bootstrap, decide, percentiles
from calctl.errors import UsageError
from calctl.runners.bench.base import (
    INTERRUPTED_EXIT,
    BenchOptions,
    ScenarioInterrupted,
    ScenarioResult,
    Table,
    interrupted_note,
)
from calctl.runners.bench.gates import MIN_SAMPLES
from calctl.runners.bench.plot import plot_timeline
from calctl.runners.device import DeviceSpec
from calctl.runners.traffic import ClientPlan, EngineLoop, EngineResult, drive_engine_request
from calctl.runtime.interface import FaultInjecting
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import ResetScope
from calctl.serving.config import default_scheduler_config
from calctl.serving.engine import DeviceSupervisor, ModelState, ServingEngine, SupervisorOptions
from calctl.serving.protocol import GenerationRequest, SamplingParams

#: Default mock time scale: jobs long enough that host overhead does not dominate B's latency.
FAULT_ISOLATION_TIME_SCALE = 5.0
PHASE_MIN_S = 2.5
BASELINE_S = 3.0
PHASE_MAX_S = 30.0  # a phase whose B has fewer jobs than a P99 needs (a loaded host) runs on, at most this long
JOB_TIMEOUT_S = 1.0  # the worker's Wait timeout (001 §11.3), short so a hang is seen quickly
LATENCY_GATE = 0.25  # B's P99 E2E may exceed its baseline by this much (001 §13.2)
A_WAITING = 4
B_CLIENTS = 2

Log = Callable[[str], None]

# The class of each phase: which grade a B impact there costs.
REQUEST, RUNTIME, LIFECYCLE = "request/resource", "runtime", "lifecycle"


@dataclass
class _Phase:
    name: str
    cls: str
    injected: str
    start: float = 0.0
    end: float = 0.0
    a_results: list[EngineResult] = field(default_factory=list)
    recoveries: list[Any] = field(default_factory=list)
    b_events: list[str] = field(default_factory=list)
    a_jobs: int = 0
    scope: str = ""
    note: str = ""
    reload: dict[str, Any] | None = None  # the supervisor's answer, for the lifecycle phases
    faults_fired: int = 0  # faults the mock injected during the phase
    b_device_s: list[float] = field(default_factory=list)  # B's jobs: end - submit on the device's clock
    scope_from_jobs: str = ""  # a scope text with {jobs}: filled with A's device jobs of the phase


class _Run:
    def __init__(self, opts: BenchOptions, log: Log) -> None:
        self.opts = opts
        self.log = log

    # -- helpers ---------------------------------------------------------------------------------

    def a_request(self, n: int, prompt_len: int, max_tokens: int, *, tag: str) -> GenerationRequest:
        return GenerationRequest(
            f"fi-{tag}-{n}",
            self.a,
            "fault-isolation",
            tuple([5] * prompt_len),
            max_tokens,
            SamplingParams(temperature=0.0),
            ignore_eos=True,
        )

    def run_a(self, requests: list[GenerationRequest], *, timeout_s: float = 60.0) -> list[EngineResult]:
        futures = [
            self.loop.submit(
                drive_engine_request(self.engine.submit, r, ClientPlan("fault-isolation"), timeout_s=timeout_s)
            )
            for r in requests
        ]
        return [f.result(timeout_s + 10) for f in futures]

    def start_a(self, requests: list[GenerationRequest], *, timeout_s: float = 60.0) -> list[Future[EngineResult]]:
        return [
            self.loop.submit(
                drive_engine_request(self.engine.submit, r, ClientPlan("fault-isolation"), timeout_s=timeout_s)
            )
            for r in requests
        ]

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Until both models are Ready again; False at the deadline, or at once when one is Failed (a Failed
        alias waits for an operator's load or reload, never recovers by itself: docs/serve.md)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if all(w.is_ready() for w in self.sup.workers.values()):
                return True
            if self.failed_aliases():
                return False
            time.sleep(0.02)
        return False

    def failed_aliases(self) -> list[str]:
        return [a for a, w in self.sup.workers.items() if w.state is ModelState.FAILED]

    def busy_retries(self) -> int:
        for metric in self.sup.metrics.registry.collect():
            for smp in metric.samples:
                if smp.name == "calctl_submit_busy_retries_total" and smp.labels.get("model") == self.a:
                    return int(smp.value)
        return 0

    def a_decode_graph(self) -> str:
        return self.sup.workers[self.a].model.decode.name

    def a_jobs_since(self, since_ns: int) -> int:
        return sum(1 for e in self.rt.trace(since_ns=since_ns) if e.model == self.a)

    async def b_client(self, index: int) -> None:
        n = 0
        while not self.stop_b:
            if not self.b_run.is_set():  # between phases: no B request in flight, so each belongs to one phase
                await asyncio.sleep(0.005)
                continue
            n += 1
            req = GenerationRequest(
                f"fi-b{index}-{n}",
                self.b,
                "fault-isolation",
                tuple(range(10, 26)),
                16,
                SamplingParams(temperature=0.0),
                ignore_eos=True,
            )
            with self.b_lock:
                self.b_inflight += 1
            try:
                res = await drive_engine_request(self.engine.submit, req, ClientPlan("b-steady"), timeout_s=60.0)
            finally:
                with self.b_lock:
                    self.b_inflight -= 1
            self.b_results.append(res)
            if not res.record.ok:
                await asyncio.sleep(0.02)

    def pause_b(self, timeout_s: float = 70.0) -> None:
        """Let B's requests in flight finish and start no new one (a clean phase boundary)."""
        self.b_run.clear()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.b_lock:
                if self.b_inflight == 0:
                    return
            time.sleep(0.005)

    # -- phases ------------------------------------------------------------------------------------

    def phase(self, name: str, cls: str, injected: str, action: Callable[[_Phase], None]) -> _Phase:
        ph = _Phase(name, cls, injected)
        self.running = name
        self.log(f"  phase {name}: {injected}")
        h0, r0 = len(self.sup.history), len(self.sup.recoveries)
        faults0 = len(self.rt.injected_faults())
        since = time.monotonic_ns()
        ph.start = time.monotonic()
        self.b_run.set()
        action(ph)
        floor_s = BASELINE_S if name == "baseline" else PHASE_MIN_S
        while (elapsed := time.monotonic() - ph.start) < floor_s or (
            elapsed < PHASE_MAX_S and self._b_jobs_since(since) < MIN_SAMPLES["p99"] + B_CLIENTS
        ):  # a phase B's latency can be judged in (its in-flight jobs aside), if the host lets it
            time.sleep(0.05)
        if not self.wait_ready():
            failed = self.failed_aliases()
            ph.note = (
                f"{', '.join(failed)} Failed (no automatic recovery left; back only by a load or reload)"
                if failed
                else "a model was not Ready again within 60 s"
            )
        self.pause_b()
        ph.end = time.monotonic()
        ph.recoveries = self.sup.recoveries[r0:]
        ph.b_events = [
            f"{e.state}" + (f" ({e.detail})" if e.detail else "") for e in self.sup.history[h0:] if e.alias == self.b
        ]
        ph.a_jobs = self.a_jobs_since(since)
        until = time.monotonic_ns()
        ph.b_device_s = [
            (e.end_ns - e.submit_ns) / 1e9
            for e in self.rt.trace(since_ns=since)
            if e.model == self.b and e.submit_ns <= until and e.end_ns is not None and e.start_ns is not None
        ]
        ph.faults_fired = len(self.rt.injected_faults()) - faults0
        if ph.scope_from_jobs:
            ph.scope = ph.scope_from_jobs.format(jobs=ph.a_jobs)
        if ph.reload is not None:
            ph.scope = _reload_scope(ph.reload, touched_b=bool(ph.b_events))
        elif not ph.scope:
            ph.scope = _scope(ph.recoveries)
        self.phases.append(ph)
        return ph

    def baseline(self, ph: _Phase) -> None:
        ph.a_results = self.run_a([self.a_request(i, 8, 8, tag="base") for i in range(6)])
        ph.scope = "no fault"

    def invalid(self, ph: _Phase) -> None:
        limit = self.engine.context_limit(self.a)
        reqs = [self.a_request(i, limit + 1 + i, 4, tag="invalid") for i in range(10)]
        reqs += [GenerationRequest(f"fi-empty-{i}", self.a, "fault-isolation", (), 4) for i in range(10)]
        ph.a_results = self.run_a(reqs)
        ph.scope_from_jobs = "request: refused before the device ({jobs} A device jobs in the phase)"

    def kv_exhausted(self, ph: _Phase) -> None:
        ph.a_results = self.run_a([self.a_request(i, 8, 16, tag="flood") for i in range(48)])
        refused = sum(1 for r in ph.a_results if r.record.status == 429)
        ph.scope = f"A's admission: {refused} x 429 beyond its lanes and bounded queue; no reset"

    def submit_busy(self, ph: _Phase) -> None:
        graph = self.a_decode_graph()
        busy0 = self.busy_retries()
        # The worker retries DeviceBusy 6 times (7 submits); 3 busy are absorbed, 7 in a row fail one job.
        self.rt.arm_fault(FaultRule(FaultKind.DEVICE_BUSY, at=(2, 3, 4, *tuple(range(20, 27))), graph=graph))
        for i in range(4):
            ph.a_results += self.run_a([self.a_request(i, 8, 12, tag="busy")])
        retries = self.busy_retries() - busy0
        ph.scope = (
            f"A's submit queue: {retries} busy retries with bounded backoff, "
            f"{sum(1 for r in ph.a_results if not r.record.ok)} job(s) failed past the limit; no reset"
        )

    def board_scope(self, kind: FaultKind) -> ResetScope:
        """How far a ``kind`` fault reaches on this board: the reset scope the board's own fault plan
        (``--fault-plan``) declares for that kind, else chip (what the mock grants by default)."""
        for rule in self.rt.fault_rules():
            if rule.kind is kind:
                return rule.reset_scope
        return ResetScope.CHIP

    def _halting(self, ph: _Phase, kind: FaultKind) -> None:
        scope = self.board_scope(kind)
        if scope is not ResetScope.CHIP:
            ph.injected += f" (reset scope {scope.value}, from the board's fault plan)"
        self.rt.arm_fault(FaultRule(kind, at=(3,), graph=self.a_decode_graph(), reset_scope=scope))
        ph.a_results = self.run_a([self.a_request(i, 8, 16, tag=kind.value) for i in range(2)])
        self.wait_ready()
        ph.a_results += self.run_a([self.a_request(9, 8, 8, tag=f"{kind.value}-after")])

    def wait_timeout(self, ph: _Phase) -> None:
        self._halting(ph, FaultKind.WAIT_TIMEOUT)

    def ccu_exception(self, ph: _Phase) -> None:
        self._halting(ph, FaultKind.CCU_EXCEPTION)

    def drain_deadline(self, ph: _Phase) -> None:
        futures = self.start_a([self.a_request(i, 8, 200, tag="long") for i in range(3)])
        self._wait_running(self.a)
        saved = self.sup.options.drain_deadline_s
        self.sup.options.drain_deadline_s = 0.1
        try:
            res = self.sup.reload()
        finally:
            self.sup.options.drain_deadline_s = saved
        ph.a_results = [f.result(70) for f in futures]
        ph.reload = res

    def unload_reload(self, ph: _Phase) -> None:
        futures = self.start_a([self.a_request(i, 8, 16, tag="reload") for i in range(2)])
        self._wait_running(self.a)
        res = self.sup.reload()
        ph.a_results = [f.result(70) for f in futures]
        ph.reload = res

    def _wait_running(self, alias: str, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        w = self.sup.workers[alias]
        while w.inflight() == 0 and time.monotonic() < end:
            time.sleep(0.005)

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> ScenarioResult:
        opts = self.opts
        device = (opts.device or DeviceSpec()).with_default_time_scale(FAULT_ISOLATION_TIME_SCALE)
        if not device.is_mock:
            raise UsageError(
                "--scenario fault-isolation arms faults at run time on the mock board; on a board, inject "
                "faults with the vendor's tools and measure B with `calctl bench --url ... --mode joint`"
            )
        if opts.package is None or opts.trust is None:
            raise UsageError("--scenario fault-isolation needs a package (PKG) and a trust policy")
        self.phases: list[_Phase] = []
        self.running = ""
        self.b_results: list[EngineResult] = []
        self.stop_b = False
        self.b_run = threading.Event()
        self.b_lock = threading.Lock()
        self.b_inflight = 0
        with device.open() as rt:
            if not isinstance(rt, FaultInjecting):
                raise UsageError("--scenario fault-isolation needs a board that injects faults (the mock)")
            self.rt = rt
            from calctl.package.reader import load_manifest, package_root

            with package_root(opts.package) as root:
                aliases = load_manifest(root).aliases
            if len(aliases) != 2:
                raise UsageError(
                    f"--scenario fault-isolation needs a package with two models, this one has {len(aliases)}"
                )
            self.a, self.b = opts.models if len(opts.models) == 2 else aliases
            if {self.a, self.b} != set(aliases):
                raise UsageError(f"--models {','.join(opts.models)}: the package's models are {', '.join(aliases)}")
            self.sup = DeviceSupervisor(
                rt,
                trust=opts.trust,
                scheduler_configs={self.a: default_scheduler_config(self.a, max_waiting_requests=A_WAITING)},
                options=SupervisorOptions(
                    warmup_iterations=1,
                    drain_deadline_s=10.0,
                    job_timeout_s=JOB_TIMEOUT_S,
                    allow_session_reset=True,  # the bench measures whether a chip reset isolates (F2)
                ),
            )
            try:
                self.log(f"  loading {opts.package} on the mock board (time scale {device.time_scale:g})")
                self.sup.start(opts.package)
                self.engine = ServingEngine(self.sup)
                with EngineLoop("fault-isolation") as loop:
                    self.loop = loop
                    try:
                        b_clients = [loop.submit(self.b_client(i)) for i in range(B_CLIENTS)]
                        t_start = time.monotonic()
                        self.phase("baseline", "-", "none", self.baseline)
                        self.phase(
                            "invalid-tensor",
                            REQUEST,
                            "10 prompts over the context limit, 10 empty prompts",
                            self.invalid,
                        )
                        self.phase(
                            "kv-exhausted",
                            REQUEST,
                            "48 concurrent 16-token requests (16 lanes + 4 waiting)",
                            self.kv_exhausted,
                        )
                        self.phase(
                            "submit-busy",
                            REQUEST,
                            "DeviceBusy on 3, then 7 consecutive A decode submits",
                            self.submit_busy,
                        )
                        self.phase(
                            "wait-timeout",
                            RUNTIME,
                            f"an A decode job hangs (job timeout {JOB_TIMEOUT_S:g} s)",
                            self.wait_timeout,
                        )
                        self.phase(
                            "ccu-exception", RUNTIME, "an A decode job ends in a CCU exception", self.ccu_exception
                        )
                        self.phase(
                            "drain-deadline",
                            LIFECYCLE,
                            "reload of A with long requests in flight, drain deadline 0.1 s",
                            self.drain_deadline,
                        )
                        self.phase("unload-reload", LIFECYCLE, "reload of A (drain completes)", self.unload_reload)
                        self.stop_b = True
                        self.b_run.set()
                        for f in b_clients:
                            f.result(70)
                    except BaseException as exc:
                        # SIGINT/SIGTERM or a failure mid-phase: end the engine while the loop still runs, so the
                        # streams of the requests it aborts can still be delivered (never into a closed loop).
                        self.stop_b = True
                        self.b_run.set()
                        self.sup.shutdown(5.0)
                        if isinstance(exc, KeyboardInterrupt) and self.phases:  # the finished phases stay
                            partial = self.result(t_start, device, interrupt=exc)
                            raise ScenarioInterrupted(exc, partial) from exc
                        raise
            finally:
                self.sup.shutdown(5.0)
        return self.result(t_start, device)

    def _b_jobs_since(self, since_ns: int) -> int:
        return sum(1 for e in self.rt.trace(since_ns=since_ns) if e.model == self.b)

    # -- judgement ---------------------------------------------------------------------------------

    def result(self, t_start: float, device: DeviceSpec, interrupt: KeyboardInterrupt | None = None) -> ScenarioResult:
        """The graded report; with ``interrupt``, the report of the phases finished before the signal
        (verdict INTERRUPTED, exit 130, nothing graded)."""
        base = self.phases[0]
        b_base = self.b_in(base)
        base_p99 = percentiles([r.record.e2e for r in b_base if r.record.ok and r.record.e2e is not None]).p99
        gate_s = base_p99 * (1 + LATENCY_GATE) if base_p99 is not None else None
        need = MIN_SAMPLES["p99"]
        base_dev = percentiles(base.b_device_s)
        dev_gate_s = base_dev.p99 * (1 + LATENCY_GATE) if base_dev.p99 is not None else None
        undecided: dict[str, list[str]] = {REQUEST: [], RUNTIME: [], LIFECYCLE: []}
        rows = []
        docs = []
        impacted_by_cls: dict[str, list[str]] = {REQUEST: [], RUNTIME: [], LIFECYCLE: []}
        for ph in self.phases:
            b = self.b_in(ph)
            b_ok = [r for r in b if r.record.ok]
            b_bad = [r for r in b if not r.record.ok]
            p99 = percentiles([r.record.e2e for r in b_ok if r.record.e2e is not None]).p99
            reasons = []
            if b_bad:
                classes = _counts(r.record.outcome.value for r in b_bad)
                reasons.append(f"{len(b_bad)} B request(s) failed or refused ({_fmt_counts(classes)})")
            if ph.b_events:  # any lifecycle event of B is B leaving Ready (and coming back)
                reasons.append(f"B lifecycle: {' -> '.join(e.split(' (')[0] for e in ph.b_events)}")
            # B's latency on the device's clock, by the decision rule: enough jobs in the baseline and the
            # phase for a P99, and its CI on one side of the gate. The host's E2E is reported, never judged.
            dev = percentiles(ph.b_device_s)
            latency: dict[str, Any] = {
                "clock": "device",
                "b_jobs": len(ph.b_device_s),
                "baseline_jobs": len(base.b_device_s),
                "p99_s": dev.p99,
                "gate_s": dev_gate_s,
                "min_samples": need,
                "passed": None,
                "why": "",
            }
            if ph.name != "baseline":
                if dev_gate_s is None or min(len(ph.b_device_s), len(base.b_device_s)) < need:
                    latency["why"] = (
                        f"not judged: a P99 needs >= {need} B jobs in the baseline and the phase, "
                        f"had {len(base.b_device_s)} and {len(ph.b_device_s)}"
                    )
                else:
                    d = decide(
                        bootstrap(ph.b_device_s, lambda x: float(np.percentile(x, 99)), seed=7),
                        dev_gate_s,
                        above=False,
                        min_samples=need,
                        what="B P99 device job latency (s)",
                        fmt=".4f",
                    )
                    latency["passed"], latency["why"] = d.passed, d.why
                    if d.passed is False:
                        reasons.append(
                            f"B P99 job latency on the device {(dev.p99 or 0) * 1e3:.1f} ms > gate {dev_gate_s * 1e3:.1f} ms "
                            f"(baseline {(base_dev.p99 or 0) * 1e3:.1f} ms + 25 %): {d.why}"
                        )
                if latency["passed"] is None and not reasons:
                    undecided[ph.cls].append(f"{ph.name} ({latency['why']})")
            impacted = bool(reasons) and ph.name != "baseline"
            if impacted:
                impacted_by_cls[ph.cls].append(ph.name)
            a_seen = _fmt_counts(_counts(r.record.outcome.value for r in ph.a_results)) or "no A request"
            rows.append(
                (
                    ph.name,
                    ph.cls,
                    ph.injected,
                    a_seen + (f"; {ph.faults_fired} fault(s) fired" if ph.faults_fired else ""),
                    ph.scope,
                    f"{len(b_ok)}/{len(b)}",
                    "n/a" if p99 is None else f"{p99 * 1e3:.0f} ms",
                    "YES: " + "; ".join(reasons) if impacted else "no",
                )
            )
            docs.append(
                {
                    "phase": ph.name,
                    "class": ph.cls,
                    "injected_on_a": ph.injected,
                    "a_outcomes": _counts(r.record.outcome.value for r in ph.a_results),
                    "a_device_jobs": ph.a_jobs,
                    "faults_fired": ph.faults_fired,
                    "scope_granted": ph.scope,
                    "recoveries": [
                        {
                            "alias": r.alias,
                            "reason": r.reason,
                            "runtime_status": r.runtime_status,
                            "scope": r.scope,
                            "affected_aliases": list(r.affected_aliases),
                            "ok": r.ok,
                            "seconds": round(r.seconds, 4),
                        }
                        for r in ph.recoveries
                    ],
                    "b_requests": len(b),
                    "b_succeeded": len(b_ok),
                    "b_outcomes": _counts(r.record.outcome.value for r in b),
                    "b_p99_e2e_s": p99,
                    "b_p99_e2e_note": "host clock (what B's clients waited, host overhead included): reported, "
                    "never judged",
                    "b_latency": latency,
                    "b_lifecycle": ph.b_events,
                    "b_impacted": impacted,
                    "b_impact": reasons if impacted else [],
                    "seconds": round(ph.end - ph.start, 3),
                    "note": ph.note,
                }
            )
        if impacted_by_cls[REQUEST]:
            grade = "F0"
            why = (
                f"request/resource faults on A impacted B ({', '.join(impacted_by_cls[REQUEST])}): A and B share "
                "even the request-level fault domain"
            )
        elif impacted_by_cls[RUNTIME] or impacted_by_cls[LIFECYCLE]:
            grade = "F1"
            why = (
                "request and resource faults on A were isolated from B; "
                + "; ".join(
                    f"{cls} faults impacted B ({', '.join(v)})"
                    for cls, v in impacted_by_cls.items()
                    if v and cls != REQUEST
                )
                + ": a shared fault domain (001 §13.4)"
            )
        else:
            grade = "F2"
            why = "no fault or lifecycle action on A impacted B (chip-scoped recovery, B untouched)"
        # Could an undecided phase still lower the grade? Then the grade is not decided (the decision rule).
        could_lower = undecided[REQUEST] if grade != "F0" else []
        if grade == "F2":
            could_lower = could_lower + undecided[RUNTIME] + undecided[LIFECYCLE]
        verdict_grade = grade
        if could_lower:
            verdict_grade = "NOT JUDGED"
            why = (
                f"{grade} at best: B's device latency not judged in {'; '.join(could_lower)}; "
                "a longer phase or a less loaded host would decide it"
            )
        if interrupt is not None:
            verdict_grade = "INTERRUPTED"
            why = interrupted_note(interrupt, self.running, [p.name for p in self.phases])
        notes = [
            why if interrupt is not None else f"grade {verdict_grade}: {why}",
            "MOCK RESULT: faults injected on the simulated board; this grades the tool and "
            "the engine's isolation logic, not a Calculet board's fault domains (docs/runtime.md §5)",
            "not exercised: KV corruption (silent on the device; only golden checks see it)",
        ]
        points = [(r.record.sent - t_start, r.record.e2e, r.record.ok) for r in self.b_results]
        plot = self.opts.out_dir / "bench.png"
        plot_timeline(
            plot,
            points=points,
            phases=[(p.name, p.start - t_start, p.end - t_start) for p in self.phases],
            gate_s=gate_s,
            title=f"calctl bench fault-isolation: {grade if interrupt is None else verdict_grade} "
            f"(B = {self.b}, faults on A = {self.a})",
            device="mock",
        )
        table = Table(
            f"fault isolation evidence (A = {self.a}, B = {self.b}; B baseline P99 E2E "
            f"{'n/a' if base_p99 is None else f'{base_p99 * 1e3:.0f} ms'})",
            (
                "phase",
                "class",
                "injected on A",
                "A saw",
                "scope the runtime granted",
                "B ok",
                "B P99 E2E",
                "B impacted",
            ),
            tuple(rows),
        )
        body = {
            "grade": verdict_grade,
            "grade_reason": why,
            "a": self.a,
            "b": self.b,
            "phases": docs,
            "b_baseline_p99_e2e_s": base_p99,
            "b_baseline_p99_device_s": base_dev.p99,
            "b_device_latency_gate_s": dev_gate_s,
            "b_latency_gate_s": gate_s,
            "device_options": device.describe(),
            **(
                {"interrupted_in": self.running or None, "phases_finished": [p.name for p in self.phases]}
                if interrupt is not None
                else {}
            ),
            "rules": {
                "F0": "a request/resource fault on A impacted B",
                "F1": "request/resource isolated; a runtime fault or lifecycle action on A impacted B",
                "F2": "nothing on A impacted B",
            },
        }
        return ScenarioResult(
            "fault-isolation",
            verdict_grade,
            INTERRUPTED_EXIT if interrupt is not None else 1 if verdict_grade == "F0" else 0,
            (),
            (table,),
            body,
            plot,
            tuple(notes),
            mock_result=True,
        )

    def b_in(self, ph: _Phase) -> list[EngineResult]:
        return [r for r in self.b_results if ph.start <= r.record.sent < ph.end]


def _scope(recoveries: list[Any]) -> str:
    if not recoveries:
        return "none needed"
    parts = []
    for r in recoveries:
        parts.append(
            f"{r.scope} reset for {r.reason} of {r.alias}, touched {', '.join(r.affected_aliases)}"
            + ("" if r.ok else " (recovery FAILED)")
        )
    return "; ".join(parts)


def _reload_scope(res: dict[str, Any], *, touched_b: bool) -> str:
    touched = "A and B" if touched_b else "A only"
    ok = "reloaded" if res.get("ok") else f"reload failed: {res.get('detail')}"
    return f"whole-package reconfigure (combined calbin, 001 §11.2), {touched}: {ok}"


def _counts(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _fmt_counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def run_fault_isolation(opts: BenchOptions, log: Log) -> ScenarioResult:
    return _Run(opts, log).run()


__all__ = ["FAULT_ISOLATION_TIME_SCALE", "run_fault_isolation"]
