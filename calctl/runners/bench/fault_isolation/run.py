"""Scenario ``fault-isolation``, the run: A and B served in-process on the mock, B's clients running throughout,
one fault or lifecycle action on A per phase (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from calctl.errors import UsageError
from calctl.runners.bench.base import (
    BenchOptions,
    Scenario,
    ScenarioInterrupted,
    ScenarioResult,
)
from calctl.runners.bench.fault_isolation.judge import scenario_result
from calctl.runners.bench.fault_isolation.plan import (
    A_WAITING,
    B_CLIENTS,
    BASELINE_S,
    FAULT_ISOLATION_TIME_SCALE,
    JOB_TIMEOUT_S,
    LIFECYCLE,
    PHASE_MAX_S,
    PHASE_MIN_S,
    REQUEST,
    RUNTIME,
    Log,
    Phase,
)
from calctl.runners.bench.gates import MIN_SAMPLES
from calctl.runners.device import DeviceSpec
from calctl.runners.serving_stack import ServingStack
from calctl.runners.traffic import ClientPlan, EngineResult, drive_engine_request
from calctl.runtime.interface import FaultInjecting
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import ResetScope
from calctl.serving.config import default_scheduler_config
from calctl.serving.engine import ModelState, ReloadResult, SupervisorOptions
from calctl.serving.protocol import GenerationRequest, SamplingParams


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

    def _b_jobs_since(self, since_ns: int) -> int:
        return sum(1 for e in self.rt.trace(since_ns=since_ns) if e.model == self.b)

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Until both models are Ready again; False at the deadline, or at once when one is Failed (a Failed
        alias waits for an operator's load or reload, never recovers by itself: docs/serve.md)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if all(self.stack.core(a).is_ready() for a in self.stack.aliases):
                return True
            if self.failed_aliases():
                return False
            time.sleep(0.02)
        return False

    def failed_aliases(self) -> list[str]:
        return [a for a in self.stack.aliases if self.stack.core(a).state is ModelState.FAILED]

    def busy_retries(self) -> int:
        return self.stack.batch_counters(self.a).submit_busy_retries

    def a_decode_graph(self) -> str:
        return self.stack.core(self.a).model.decode.name

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

    def phase(self, name: str, cls: str, injected: str, action: Callable[[Phase], None]) -> Phase:
        ph = Phase(name, cls, injected)
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

    def baseline(self, ph: Phase) -> None:
        ph.a_results = self.run_a([self.a_request(i, 8, 8, tag="base") for i in range(6)])
        ph.scope = "no fault"

    def invalid(self, ph: Phase) -> None:
        limit = self.engine.context_limit(self.a)
        reqs = [self.a_request(i, limit + 1 + i, 4, tag="invalid") for i in range(10)]
        reqs += [GenerationRequest(f"fi-empty-{i}", self.a, "fault-isolation", (), 4) for i in range(10)]
        ph.a_results = self.run_a(reqs)
        ph.scope_from_jobs = "request: refused before the device ({jobs} A device jobs in the phase)"

    def kv_exhausted(self, ph: Phase) -> None:
        ph.a_results = self.run_a([self.a_request(i, 8, 16, tag="flood") for i in range(48)])
        refused = sum(1 for r in ph.a_results if r.record.status == 429)
        ph.scope = f"A's admission: {refused} x 429 beyond its lanes and bounded queue; no reset"

    def submit_busy(self, ph: Phase) -> None:
        graph = self.a_decode_graph()
        busy0 = self.busy_retries()
        # A's engine core retries DeviceBusy 6 times (7 submits); 3 busy are absorbed, 7 in a row fail one job.
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

    def _halting(self, ph: Phase, kind: FaultKind) -> None:
        scope = self.board_scope(kind)
        if scope is not ResetScope.CHIP:
            ph.injected += f" (reset scope {scope.value}, from the board's fault plan)"
        self.rt.arm_fault(FaultRule(kind, at=(3,), graph=self.a_decode_graph(), reset_scope=scope))
        ph.a_results = self.run_a([self.a_request(i, 8, 16, tag=kind.value) for i in range(2)])
        self.wait_ready()
        ph.a_results += self.run_a([self.a_request(9, 8, 8, tag=f"{kind.value}-after")])

    def wait_timeout(self, ph: Phase) -> None:
        self._halting(ph, FaultKind.WAIT_TIMEOUT)

    def ccu_exception(self, ph: Phase) -> None:
        self._halting(ph, FaultKind.CCU_EXCEPTION)

    def drain_deadline(self, ph: Phase) -> None:
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

    def unload_reload(self, ph: Phase) -> None:
        futures = self.start_a([self.a_request(i, 8, 16, tag="reload") for i in range(2)])
        self._wait_running(self.a)
        res = self.sup.reload()
        ph.a_results = [f.result(70) for f in futures]
        ph.reload = res

    def _wait_running(self, alias: str, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        w = self.stack.core(alias)
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
        self.phases: list[Phase] = []
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
            with ServingStack(
                rt,
                trust=opts.trust,
                name="fault-isolation",
                scheduler_configs={self.a: default_scheduler_config(self.a, max_waiting_requests=A_WAITING)},
                options=SupervisorOptions(
                    warmup_iterations=1,
                    drain_deadline_s=10.0,
                    job_timeout_s=JOB_TIMEOUT_S,
                    allow_session_reset=True,  # the bench measures whether a chip reset isolates (F2)
                ),
            ) as stack:
                self.stack, self.sup, self.engine = stack, stack.sup, stack.engine
                self.log(f"  loading {opts.package} on the mock board (time scale {device.time_scale:g})")
                stack.start(opts.package)
                self.loop = loop = stack.loop
                t_start = time.monotonic()
                try:
                    with contextlib.ExitStack() as on_error:
                        # SIGINT/SIGTERM or a failure mid-phase: end the engine while the loop still runs, so the
                        # streams of the requests it aborts can still be delivered (never into a closed loop).
                        on_error.callback(self._stop_engine)
                        b_clients = [loop.submit(self.b_client(i)) for i in range(B_CLIENTS)]
                        for name, kind, what, action in self._phases():
                            self.phase(name, kind, what, action)
                        self._stop_b()
                        for f in b_clients:
                            f.result(70)
                        on_error.pop_all()
                except KeyboardInterrupt as exc:
                    if self.phases:  # the finished phases stay
                        raise ScenarioInterrupted(exc, self._result(t_start, device, interrupt=exc)) from exc
                    raise
        return self._result(t_start, device)

    def _phases(self) -> tuple[tuple[str, str, str, Callable[[Phase], None]], ...]:
        """The phases in order: name, fault class, what is done to A, the action."""
        return (
            ("baseline", "-", "none", self.baseline),
            ("invalid-tensor", REQUEST, "10 prompts over the context limit, 10 empty prompts", self.invalid),
            ("kv-exhausted", REQUEST, "48 concurrent 16-token requests (16 lanes + 4 waiting)", self.kv_exhausted),
            ("submit-busy", REQUEST, "DeviceBusy on 3, then 7 consecutive A decode submits", self.submit_busy),
            ("wait-timeout", RUNTIME, f"an A decode job hangs (job timeout {JOB_TIMEOUT_S:g} s)", self.wait_timeout),
            ("ccu-exception", RUNTIME, "an A decode job ends in a CCU exception", self.ccu_exception),
            (
                "drain-deadline",
                LIFECYCLE,
                "reload of A with long requests in flight, drain deadline 0.1 s",
                self.drain_deadline,
            ),
            ("unload-reload", LIFECYCLE, "reload of A (drain completes)", self.unload_reload),
        )

    def _stop_b(self) -> None:
        self.stop_b = True
        self.b_run.set()

    def _stop_engine(self) -> None:
        self._stop_b()
        self.sup.shutdown(5.0)

    def _result(self, t_start: float, device: DeviceSpec, interrupt: KeyboardInterrupt | None = None) -> ScenarioResult:
        """The graded report; with ``interrupt``, the report of the phases finished before the signal
        (verdict INTERRUPTED, exit 130, nothing graded)."""
        return scenario_result(
            self.opts,
            self.a,
            self.b,
            self.phases,
            self.b_results,
            running=self.running,
            t_start=t_start,
            device=device,
            interrupt=interrupt,
        )


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


def _reload_scope(res: ReloadResult, *, touched_b: bool) -> str:
    touched = "A and B" if touched_b else "A only"
    ok = "reloaded" if res.ok else f"reload failed: {res.detail}"
    return f"whole-package reconfigure (combined calbin, 001 §11.2), {touched}: {ok}"


def run_fault_isolation(opts: BenchOptions, log: Log) -> ScenarioResult:
    return _Run(opts, log).run()


FAULT_ISOLATION = Scenario(
    "fault-isolation",
    "faults injected on A in-process on the mock, B measured throughout: F0/F1/F2 (001 §13.4)",
    run_fault_isolation,
    needs_url=False,
    options=("PKG", "--models", "--time-scale", "--fault-plan"),
)
