"""``calctl soak``: load/unload cycles under mixed traffic, checked after every cycle (000 §19 M0/M4, 001 §12 Phase 5, §13.3).

One cycle, on the real serving engine driven in-process (no HTTP):

1. **load** – ``DeviceSupervisor.start`` (cycle 0) or ``load``: trust, hashes,
   validation, capacity plan, configure, then golden + warm-up of every alias
   before Ready (000 §11). The generation published and the golden + warm-up
   time per alias are recorded. A combined package loads and unloads as a whole
   (001 §11.2): both aliases go through every cycle together.
2. **traffic** – for ``traffic_seconds``, ``clients_per_model`` clients per alias
   send the mixed traffic of :mod:`calctl.runners.soak.mix` (streaming and not,
   cancellations, deadlines, early stops, long prompts, invalid requests)
   through :class:`~calctl.serving.engine.ServingEngine` on an asyncio loop in
   its own thread. The traffic keeps running through the unload and the next
   load, so drains with requests in flight, 503 while unloaded and requests
   waiting for the next generation are all exercised. Every finished request is
   checked (:mod:`calctl.runners.soak.checks`): exactly one end, token count,
   and the generation of every token it received.
3. **unload** – ``DeviceSupervisor.unload`` (drain with a deadline, teardown,
   ResetConfiguration), then per chip: memory against the baseline measured
   before the first load (drift limit ``max(64 MiB, 1 % local DRAM)``), job
   counters closed (nothing pending; jobs the host submitted in the cycle,
   counted at the runtime boundary, equal the jobs the device finished or
   failed), workers with nothing in flight or quarantined; and this process's
   own resident memory (VmRSS) against the first cycle's (``host_memory_growth``).

The last cycle stops the traffic and lets every request finish before its
unload, so at the end nothing is left open. ``AlreadyConfigured`` or any other
load/unload failure is a violation and ends the soak. Errors are counted by
class (request outcomes, device errors by runtime status, stale completions the
engine dropped, recoveries). A device error, or a drain that missed its
deadline, is a violation unless the mock injected faults that explain it.

``--inject stale-completion`` arms the worker's diagnostic hook
(:class:`~calctl.serving.engine.inject.StaleRedelivery`, a delivery tap): after
the first reload one token of the retired generation is delivered to a request
of the new one, and the soak must exit 1 naming it. It exists to prove the
checker, never for serving.

Evidence (:mod:`calctl.runners.soak.evidence`): ``events.ndjson`` appended as it
happens, ``soak-report.json`` rewritten atomically at every checkpoint (every
``checkpoint_interval_s``, default 60 s) and cycle end, ``soak.png`` at the end.
Mock results are labelled as such (docs/runtime.md §5). This module does not print.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calctl import html_report, records
from calctl.budget.host import proc_status_bytes
from calctl.checks.stats import percentiles
from calctl.errors import CalctlError, CheckFailed, ExitCode, Interrupted, UsageError
from calctl.package.reader import load_manifest, package_root
from calctl.package.validate import ValidationPolicy, validate
from calctl.report import Report, build_header, verdict_of_exit_code
from calctl.runners.device import DeviceSpec
from calctl.runners.plotting import save
from calctl.runners.soak import checks, evidence
from calctl.runners.soak.mix import MixedTraffic, ModelLimits
from calctl.runners.traffic import EngineLoop, EngineResult, RequestOutcome, drive_engine_request, error_reason
from calctl.runtime.errors import AlreadyConfigured, RuntimeLayerError
from calctl.runtime.interface import FaultInjecting, Runtime
from calctl.runtime.types import ChipCounters, ChipMemory, Job
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.serving.engine.inject import StaleRedelivery
from calctl.signing.policy import TrustPolicy

MIB = checks.MIB
_ADMITTED_OUTCOMES = frozenset({RequestOutcome.OK, RequestOutcome.CANCELLED, RequestOutcome.DEVICE_ERROR})


class Traffic(str, enum.Enum):
    MIXED = "mixed"  # the mix of soak.mix on every alias
    NONE = "none"  # load/unload cycles only


class Injection(str, enum.Enum):
    """Diagnostic injections that must make the soak fail (they prove its checkers)."""

    STALE_COMPLETION = "stale-completion"


@dataclass(frozen=True)
class SoakConfig:
    package: Path
    trust: TrustPolicy
    device: DeviceSpec
    out_dir: Path
    cycles: int | None = None
    hours: float | None = None
    traffic: Traffic = Traffic.MIXED
    traffic_seconds: float = 2.0
    clients_per_model: int = 3
    inject: frozenset[Injection] = frozenset()
    seed: int = 0
    checkpoint_interval_s: float = 60.0
    sample_interval_s: float = 0.25
    warmup_iterations: int = 1
    drain_deadline_s: float = 30.0
    job_timeout_s: float = 30.0
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if (self.cycles is None) == (self.hours is None):
            raise UsageError("give exactly one of --cycles N and --hours H")
        if self.cycles is not None and self.cycles < 1:
            raise UsageError(f"--cycles {self.cycles}: at least 1")
        if self.hours is not None and not self.hours > 0:
            raise UsageError(f"--hours {self.hours}: expected a positive number")
        if not self.traffic_seconds >= 0:
            raise UsageError(f"--traffic-seconds {self.traffic_seconds}: expected >= 0")
        if self.clients_per_model < 1:
            raise UsageError("--clients must be at least 1")
        if self.inject and self.traffic is Traffic.NONE:
            raise UsageError(
                "--inject needs traffic: the injected fault is only visible to requests (use --traffic mixed)"
            )
        if Injection.STALE_COMPLETION in self.inject and self.cycles is not None and self.cycles < 2:
            raise UsageError("--inject stale-completion needs at least 2 cycles: it fires after the first reload")
        if not self.checkpoint_interval_s > 0 or not self.sample_interval_s > 0:
            raise UsageError("checkpoint and sample intervals must be positive")


@dataclass(frozen=True)
class SoakProgress:
    """A live view for a progress bar (``on_progress``)."""

    phase: str  # loading | traffic | unloading | draining | done
    elapsed_s: float
    cycles_done: int
    cycles_total: int | None
    deadline_s: float | None
    requests: int
    ok: int
    rejected: int
    errors: int
    violations: int
    generation: int | None
    max_drift_mib: dict[int, float | None]
    by_outcome: dict[str, int] = field(default_factory=dict)  # the same counts the summary shows


def default_report_dir(now: datetime | None = None) -> Path:
    return records.default_report_dir("soak", now)


# ---------------------------------------------------------------------------
# Submits counted on the host


class SubmitCounter:
    """Every submit the runtime accepted, per chip (``Runtime.on_submit``): the host side of "job counters
    close", checked against the chips' own counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_chip: Counter[int] = Counter()

    def count(self, job: Job) -> None:
        with self._lock:
            for c in job.chips:
                self._per_chip[c] += 1

    def submitted(self) -> dict[int, int]:
        with self._lock:
            return dict(self._per_chip)


# ---------------------------------------------------------------------------
# Request accounting (written by the traffic loop thread, read by the main and sampler threads)


class _Requests:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.outstanding = 0
        self.by_outcome: Counter[str] = Counter()
        self.by_alias_outcome: dict[str, Counter[str]] = {}
        self.by_kind_outcome: dict[str, Counter[str]] = {}
        self.device_error_reasons: Counter[str] = Counter()
        self.cycle_outcomes: Counter[str] = Counter()
        self.cycle_e2e: dict[str, list[float]] = {}
        self.cycle_ttft: dict[str, list[float]] = {}
        self.latency: dict[str, evidence.Series] = {}
        self.ended: dict[str, evidence.Series] = {}  # the requests that did not succeed, by outcome (soak.png)

    def add(self, result: EngineResult, t: float) -> None:
        rec = result.record
        with self.lock:
            o = rec.outcome.value
            self.by_outcome[o] += 1
            self.cycle_outcomes[o] += 1
            self.by_alias_outcome.setdefault(rec.alias, Counter())[o] += 1
            self.by_kind_outcome.setdefault(rec.kind, Counter())[o] += 1
            if rec.outcome is RequestOutcome.DEVICE_ERROR:
                self.device_error_reasons[error_reason(rec.error)] += 1
            if rec.ok and rec.e2e is not None:
                self.cycle_e2e.setdefault(rec.alias, []).append(rec.e2e)
                self.latency.setdefault(rec.alias, evidence.Series()).add(t, rec.e2e)
                if rec.ttft is not None:
                    self.cycle_ttft.setdefault(rec.alias, []).append(rec.ttft)
            elif not rec.ok:
                self.ended.setdefault(o, evidence.Series()).add(t, rec.e2e if rec.e2e is not None else 0.0)

    def take_cycle(self) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        with self.lock:
            outcomes = dict(self.cycle_outcomes)
            lat: dict[str, dict[str, Any]] = {}
            for alias in sorted(set(self.cycle_e2e) | set(self.cycle_ttft)):
                e2e = percentiles(self.cycle_e2e.get(alias, []))
                ttft = percentiles(self.cycle_ttft.get(alias, []))
                lat[alias] = {
                    "n": e2e.count,
                    "e2e_p50_ms": _ms(e2e.p50),
                    "e2e_p99_ms": _ms(e2e.p99),
                    "ttft_p50_ms": _ms(ttft.p50),
                    "ttft_p99_ms": _ms(ttft.p99),
                }
            self.cycle_outcomes = Counter()
            self.cycle_e2e, self.cycle_ttft = {}, {}
            return outcomes, lat


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 3)


# ---------------------------------------------------------------------------
# The traffic: clients on the engine loop


class _TrafficDriver:
    def __init__(
        self,
        loop: EngineLoop,
        engine: ServingEngine,
        sup: DeviceSupervisor,
        config: SoakConfig,
        on_result: Callable[[EngineResult], None],
        requests: _Requests,
    ) -> None:
        self._loop = loop
        self._engine = engine
        self._sup = sup
        self._config = config
        self._on_result = on_result
        self._requests = requests
        self._stop = threading.Event()
        self._futures: list[Any] = []

    def start(self) -> None:
        for alias in self._sup.workers:
            limits = ModelLimits(self._engine.context_limit(alias), self._engine.codec(alias).vocab_size)
            for i in range(self._config.clients_per_model):
                mix = MixedTraffic(alias, limits, seed=self._config.seed, client=i)
                self._futures.append(self._loop.submit(self._client(alias, mix, i)))

    async def _client(self, alias: str, mix: MixedTraffic, index: int) -> None:
        worker = self._sup.workers[alias]
        pause = random.Random(f"{self._config.seed}/pause/{alias}/{index}")
        while not self._stop.is_set():
            req, plan = mix.next()
            with self._requests.lock:
                self._requests.sent += 1
                self._requests.outstanding += 1
            try:
                res = await drive_engine_request(
                    self._engine.submit,
                    req,
                    plan,
                    timeout_s=self._config.request_timeout_s,
                    served_generation=lambda: worker.generation,
                )
            finally:
                with self._requests.lock:
                    self._requests.outstanding -= 1
            self._on_result(res)
            if res.record.outcome in (RequestOutcome.UNAVAILABLE, RequestOutcome.CAPACITY):
                await asyncio.sleep(pause.uniform(0.05, 0.15))  # back off while the model is away
            else:
                await asyncio.sleep(pause.uniform(0.0, 0.004))

    def stop(self, timeout_s: float) -> int:
        """Stop sending; wait for every client's request in flight to end. Returns clients still running."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        running = 0
        for f in self._futures:
            try:
                f.result(max(0.0, deadline - time.monotonic()))
            except Exception:
                if not f.done():
                    running += 1
                    f.cancel()
        self._futures = []
        return running


# ---------------------------------------------------------------------------
# The soak


@dataclass
class _Cycle:
    index: int
    started_s: float
    loaded_s: float | None = None
    unloaded_s: float | None = None
    doc: dict[str, Any] = field(default_factory=dict)


class _Soak:
    def __init__(self, config: SoakConfig, on_progress: Callable[[SoakProgress], None] | None) -> None:
        self.config = config
        self.on_progress = on_progress
        self.t0 = time.monotonic()
        self.started_at = datetime.now(timezone.utc)
        config.out_dir.mkdir(parents=True, exist_ok=True)
        self.events = evidence.EventLog(config.out_dir / evidence.EVENTS_FILE, self.t0)
        self.violations = checks.ViolationBook()
        self.requests = _Requests()
        self.cycles: list[_Cycle] = []
        self.lifecycle_errors: Counter[str] = Counter()
        self.drain_deadline_hits = 0
        self.memory_series: dict[int, evidence.Series] = {}
        self.baseline: list[ChipMemory] = []
        self.max_drift: dict[int, int | None] = {}
        self.host_rss: list[tuple[int, int | None]] = []  # (cycle, VmRSS after its unload) of this process
        self.header: dict[str, Any] = {}
        self.error_verdict = "ERROR"
        self.phase = "starting"
        self.status = "running"
        self.rt: Runtime | None = None
        self.submits = SubmitCounter()
        self.sup: DeviceSupervisor | None = None
        self._lock = threading.RLock()
        self._stop_sampler = threading.Event()
        self._last_checkpoint = 0.0
        self.cycles_done = 0
        self.end_s: float | None = None
        self.interrupted: dict[str, Any] | None = None  # signal, phase, cycle cut short, when

    # -- time / progress -----------------------------------------------------------------------

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def cycle_index(self) -> int | None:
        return self.cycles[-1].index if self.cycles else None

    def progress(self) -> SoakProgress:
        with self.requests.lock:
            by = Counter(self.requests.by_outcome)
            sent = self.requests.sent
        rejected = sum(
            by[o.value]
            for o in (
                RequestOutcome.INVALID,
                RequestOutcome.CAPACITY,
                RequestOutcome.UNAVAILABLE,
                RequestOutcome.DEADLINE,
                RequestOutcome.NOT_FOUND,
            )
        )
        errors = sum(
            by[o.value] for o in (RequestOutcome.DEVICE_ERROR, RequestOutcome.TIMEOUT, RequestOutcome.TRANSPORT)
        )
        gen = None
        if self.sup is not None and self.sup.workers:
            gen = max(w.generation for w in self.sup.workers.values())
        c = self.config
        return SoakProgress(
            phase=self.phase,
            elapsed_s=self.now_s(),
            cycles_done=self.cycles_done,
            cycles_total=c.cycles,
            deadline_s=c.hours * 3600 if c.hours is not None else None,
            requests=sent,
            ok=by[RequestOutcome.OK.value] + by[RequestOutcome.CANCELLED.value],
            rejected=rejected,
            errors=errors,
            violations=len(self.violations),
            generation=gen,
            max_drift_mib={k: (None if v is None else v / MIB) for k, v in self.max_drift.items()},
            by_outcome=dict(by),
        )

    def violate(self, v: checks.Violation) -> None:
        if self.violations.add(v):
            self.events.write("violation", kind=v.kind, message=v.message, cycle=v.cycle, detail=dict(v.detail))

    # -- sampler / checkpoints ---------------------------------------------------------------------

    def _sampler(self) -> None:
        next_progress = 0.0
        while not self._stop_sampler.wait(self.config.sample_interval_s):
            try:
                self.sample_memory()
                now = self.now_s()
                if now - self._last_checkpoint >= self.config.checkpoint_interval_s:
                    self.checkpoint("interval")
                if self.on_progress is not None and now >= next_progress:
                    next_progress = now + 0.5
                    self.on_progress(self.progress())
            except Exception as exc:
                self.events.write("sampler_error", error=f"{type(exc).__name__}: {exc}")

    def sample_memory(self) -> list[ChipMemory] | None:
        rt = self.rt
        if rt is None:
            return None
        try:
            mem = list(rt.memory_usage())
        except (RuntimeLayerError, AttributeError):
            return None
        t = self.now_s()
        for m in mem:
            if m.used_bytes is not None:
                self.memory_series.setdefault(m.chip, evidence.Series()).add(t, float(m.used_bytes))
        return mem

    def checkpoint(self, why: str) -> None:
        with self._lock:
            self._last_checkpoint = self.now_s()
            doc = self.document()
            evidence.write_json_atomic(self.config.out_dir / evidence.REPORT_FILE, doc)
            self.events.write("checkpoint", why=why, cycles=self.cycles_done, violations=len(self.violations))
            self.events.sync()

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> Report:
        c = self.config
        self.events.write(
            "soak_start",
            package=str(c.package),
            device=c.device.describe(),
            cycles=c.cycles,
            hours=c.hours,
            traffic=c.traffic.value,
            traffic_seconds=c.traffic_seconds,
            inject=sorted(i.value for i in c.inject),
            seed=c.seed,
        )
        sampler = threading.Thread(target=self._sampler, name="soak-sampler", daemon=True)
        try:
            try:
                self._validate()
            except KeyboardInterrupt:
                raise
            except BaseException:
                self.events.close()
                raise
            self._on_device(sampler)
        except KeyboardInterrupt as exc:
            self._note_interrupt(exc)
            self.status = "interrupted"
        except CalctlError as exc:
            if exc.exit_code == ExitCode.USAGE:
                # A missing package (exit 2): the soak did not run, and its report must not read PASS.
                self.status = "error"
                self.error_verdict = "ERROR"
                self.header["error"] = f"{type(exc).__name__}: {exc}"
                raise
            # The device could not be opened, or failed outside a cycle (exit 3): the report says how far it got.
            self.status = "error"
            self.error_verdict = verdict_of_exit_code(exc.exit_code)
            self.header["error"] = f"{type(exc).__name__}: {exc}"
            self.events.write("error", error=self.header["error"])
        finally:
            self._stop_sampler.set()
            self._close_interrupted_cycle()
            if sampler.is_alive():
                sampler.join(5)
            self.end_s = self.now_s()
            self.phase = "done"
            if self.status == "running":
                self.status = "finished"
            ok = self.status == "finished" and len(self.violations) == 0
            # A run that never reached the device draws no (empty) picture.
            self.header["files"] = self._plot() if self.rt is not None else self._files()
            self.events.write(
                "soak_end",
                status=self.status,
                verdict=self.verdict(),
                ok=ok,
                cycles=self.cycles_done,
                violations=len(self.violations),
            )
            with self._lock:
                report = self.report()
                document = report.document()
                evidence.write_json_atomic(c.out_dir / evidence.REPORT_FILE, document)
                html_report.write(document, c.out_dir / evidence.REPORT_FILE)
            self.events.close()
            if self.on_progress is not None:
                self.on_progress(self.progress())
        return report

    def _note_interrupt(self, exc: BaseException) -> None:
        """Remember where SIGINT/SIGTERM arrived (the first time): the phase and the cycle it cut short."""
        if self.interrupted is not None:
            return
        cut = self.cycles[-1].index if self.cycles and self.cycles[-1].index > self.cycles_done else None
        self.interrupted = {
            "signal": exc.signal_name if isinstance(exc, Interrupted) else "SIGINT",
            "phase": self.phase,
            "cycle": cut,
            "at_s": round(self.now_s(), 3),
        }

    def _close_interrupted_cycle(self) -> None:
        """The event log and the cycle records say which cycle the interrupt cut short, and in which phase."""
        i = self.interrupted
        if i is None or i["cycle"] is None:
            return
        cyc = self.cycles[-1]
        cyc.doc["interrupted"] = {"signal": i["signal"], "phase": i["phase"], "at_s": i["at_s"]}
        self.events.write("cycle_interrupted", cycle=i["cycle"], phase=i["phase"], signal=i["signal"])

    def verdict(self) -> str:
        """The soak's word in docs/cli.md's vocabulary: PASS, FAIL, INTERRUPTED, ERROR (RUNNING while it runs)."""
        if self.status == "interrupted":
            return "INTERRUPTED"
        if self.status == "error":
            return self.error_verdict  # the word of what ended it: ERROR (device), FAIL (refused), TIMEOUT
        if self.phase != "done":
            return "RUNNING"
        return "PASS" if self.status == "finished" and not len(self.violations) else "FAIL"

    def _on_device(self, sampler: threading.Thread) -> None:
        c = self.config
        with c.device.open() as rt:
            self.rt = rt
            rt.on_submit(self.submits.count)  # every accepted submit: the engine's and golden/warm-up's
            v = rt.versions()
            self.header["runtime"] = {"runtime": v.runtime, "driver": v.driver, "firmware": v.firmware, "abi": v.abi}
            try:
                self.baseline = list(rt.memory_usage())  # before the first load (001 §13.3)
            except RuntimeLayerError as exc:  # a runtime without per-chip memory: drift is null, never a pass
                self.events.write("memory_not_reported", error=f"{type(exc).__name__}: {exc}")
            self.max_drift = {m.chip: 0 if m.used_bytes is not None else None for m in self.baseline}
            self.events.write("baseline", memory=[_mem_doc(m) for m in self.baseline])
            self.sample_memory()
            sampler.start()
            self.sup = sup = DeviceSupervisor(
                rt,
                trust=c.trust,
                options=SupervisorOptions(
                    warmup_iterations=c.warmup_iterations,
                    drain_deadline_s=c.drain_deadline_s,
                    job_timeout_s=c.job_timeout_s,
                ),
            )
            loop = EngineLoop("soak-traffic")
            traffic: list[_TrafficDriver] = []
            try:
                self._cycles(sup, rt, loop, traffic)
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    self._note_interrupt(exc)  # before the teardown changes the phase
                # Ctrl-C/SIGTERM or a failure mid-cycle: give the clients a moment, then cancel what is left.
                for t in traffic:
                    t.stop(5.0)
                traffic.clear()
                raise
            finally:
                self.phase = "draining"
                for t in traffic:  # still running after a failed load or unload
                    hung = t.stop(c.request_timeout_s + 5.0)
                    if hung:
                        self.violate(
                            checks.Violation(
                                "request_hung",
                                f"{hung} client(s) still had a request open at the end of the soak",
                                self.cycle_index(),
                                self.now_s(),
                                subject="end",
                            )
                        )
                loop.close()
                self._final_checks(sup)
                sup.shutdown(c.drain_deadline_s)
                self.sample_memory()

    def _validate(self) -> None:
        """Validate once up front (the supervisor validates again at every load): fail before the device."""
        c = self.config
        report = validate(c.package, ValidationPolicy(trust=c.trust))
        with package_root(c.package) as root:
            pkg = load_manifest(root)
        self.header["package"] = {
            "path": str(c.package),
            "name": pkg.name,
            "version": pkg.version,
            "kind": pkg.kind,
            "aliases": list(pkg.aliases),
            "digest": report.digest,
            "signer_key_id": report.signer_key_id,
        }
        self.header["validation"] = {
            "ok": report.ok,
            "failed_rules": list(report.failed_ids()),
            "warnings": list(dict.fromkeys(x.id for x in report.warnings)),
        }
        if not report:
            self.events.write("validation_failed", failed=list(report.failed_ids()))
            raise CheckFailed(
                f"{c.package}: the package failed validation ({', '.join(report.failed_ids())}); "
                "the soak never touched the device",
                hint=f"run `calctl validate {c.package}`",
            )

    def _last(self, index: int) -> bool:
        c = self.config
        if c.cycles is not None:
            return index == c.cycles
        assert c.hours is not None
        return self.now_s() >= c.hours * 3600

    def _cycles(self, sup: DeviceSupervisor, rt: Runtime, loop: EngineLoop, traffic: list[_TrafficDriver]) -> None:
        """Cycle until done or a load/unload fails. ``traffic`` holds the running driver, for the caller's cleanup."""
        c = self.config
        index = 1  # cycles are numbered from 1 in every report and message
        while True:
            cyc = _Cycle(index, self.now_s())
            self.cycles.append(cyc)
            self.events.write("cycle_start", cycle=index)
            counters_before = _counters(rt)
            submitted_before = self.submits.submitted()
            if not self._load(sup, cyc):
                return
            if index == 1 and c.traffic is Traffic.MIXED:
                if Injection.STALE_COMPLETION in c.inject:
                    for w in sup.workers.values():
                        w.add_delivery_tap(StaleRedelivery(w.alias))
                    self.events.write(
                        "inject",
                        what=Injection.STALE_COMPLETION.value,
                        detail="diagnostic: one token of a retired generation is re-delivered after the first reload",
                    )
                driver = _TrafficDriver(loop, ServingEngine(sup), sup, c, self._on_result, self.requests)
                traffic.append(driver)
                driver.start()
            self.phase = "traffic"
            end = time.monotonic() + c.traffic_seconds
            while time.monotonic() < end:
                time.sleep(min(0.05, max(0.0, end - time.monotonic())))
            last = self._last(index)
            if last and traffic:
                # The last cycle lets every request finish before its unload: nothing is left open at the end.
                self.phase = "draining"
                hung = traffic.pop().stop(c.request_timeout_s + 5.0)
                self.events.write("traffic_stopped", clients_still_running=hung)
                if hung:
                    self.violate(
                        checks.Violation(
                            "request_hung",
                            f"{hung} client(s) still had a request open after {c.request_timeout_s + 5.0:g} s",
                            index,
                            self.now_s(),
                            subject="end",
                        )
                    )
            if not self._unload(sup, cyc, counters_before, submitted_before, rt):
                return
            self.cycles_done = index
            self.checkpoint("cycle end")
            if last:
                return
            index += 1

    def _load(self, sup: DeviceSupervisor, cyc: _Cycle) -> bool:
        c = self.config
        self.phase = "loading"
        h0 = len(sup.history)
        t = time.monotonic()
        try:
            if not sup.workers:
                sup.start(c.package)
            else:
                res = sup.load(c.package)
                if not res.get("ok"):
                    raise CheckFailed(f"load refused: {res.get('detail')}")
        except (CalctlError, RuntimeLayerError) as exc:
            name = type(exc).__name__
            self.lifecycle_errors[f"load:{name}"] += 1
            kind = "already_configured" if isinstance(exc, AlreadyConfigured) else "load_failed"
            self.violate(
                checks.Violation(
                    kind, f"cycle {cyc.index}: load failed: {name}: {exc}", cyc.index, self.now_s(), subject=kind
                )
            )
            cyc.doc["load"] = {"ok": False, "error": f"{name}: {exc}", "seconds": round(time.monotonic() - t, 4)}
            self.events.write("load_failed", cycle=cyc.index, error=f"{name}: {exc}")
            self.status = "aborted"
            return False
        seconds = time.monotonic() - t
        cyc.loaded_s = self.now_s()
        gens = {a: w.generation for a, w in sup.workers.items()}
        gw = _golden_warmup_seconds(sup.history[h0:])
        cyc.doc["load"] = {
            "ok": True,
            "seconds": round(seconds, 4),
            "generations": gens,
            "golden_warmup_s": gw,
            "warmup_iterations": c.warmup_iterations,
        }
        self.events.write("loaded", cycle=cyc.index, seconds=round(seconds, 4), generations=gens, golden_warmup_s=gw)
        self.sample_memory()
        return True

    def _unload(
        self,
        sup: DeviceSupervisor,
        cyc: _Cycle,
        counters_before: list[ChipCounters],
        submitted_before: dict[int, int],
        rt: Runtime,
    ) -> bool:
        self.phase = "unloading"
        t = time.monotonic()
        try:
            res = sup.unload()
            if not res.get("ok"):
                raise CheckFailed(f"unload refused: {res.get('detail')}")
        except (CalctlError, RuntimeLayerError) as exc:
            name = type(exc).__name__
            self.lifecycle_errors[f"unload:{name}"] += 1
            self.violate(
                checks.Violation(
                    "unload_failed",
                    f"cycle {cyc.index}: unload failed: {name}: {exc}",
                    cyc.index,
                    self.now_s(),
                    subject="unload_failed",
                )
            )
            self.events.write("unload_failed", cycle=cyc.index, error=f"{name}: {exc}")
            self.status = "aborted"
            return False
        seconds = time.monotonic() - t
        cyc.unloaded_s = self.now_s()
        drained = bool(res.get("drained_in_time", True))
        if not drained:
            self.drain_deadline_hits += 1
        at = self.now_s()
        mem = self.sample_memory() or []
        drifts, mem_violations = checks.check_memory(self.baseline, mem, cycle=cyc.index, at_s=at)
        for d in drifts:
            if d.drift_bytes is not None:
                prev = self.max_drift.get(d.chip)
                self.max_drift[d.chip] = d.drift_bytes if prev is None or abs(d.drift_bytes) > abs(prev) else prev
        after = _counters(rt)
        submitted_now = self.submits.submitted()
        delta = {chip: n - submitted_before.get(chip, 0) for chip, n in submitted_now.items()}
        found = mem_violations + checks.check_counters(counters_before, after, delta, cycle=cyc.index, at_s=at)
        gc.collect()  # unreachable cycles are not a leak
        rss = proc_status_bytes("VmRSS")
        reference = self.host_rss[0][1] if self.host_rss else rss
        self.host_rss.append((cyc.index, rss))
        found += checks.check_host_rss(reference, rss, cycle=cyc.index, at_s=at)
        for alias, w in sup.workers.items():
            if w.inflight() or w.quarantined():
                found.append(
                    checks.Violation(
                        "worker_not_drained",
                        f"{alias}: {w.inflight()} job(s) in flight and {w.quarantined()} quarantined "
                        f"after the unload of cycle {cyc.index}",
                        cyc.index,
                        at,
                        subject=alias,
                    )
                )
        for v in found:
            self.violate(v)
        outcomes, latency = self.requests.take_cycle()
        cyc.doc.update(
            unload={"ok": True, "seconds": round(seconds, 4), "drained_in_time": drained},
            memory_after_unload=[d.document() for d in drifts],
            host_rss_bytes=rss,
            counters=[
                {
                    "chip": a.chip,
                    "pending": a.pending,
                    "finished": a.finished,
                    "failed": a.failed,
                    "submitted_in_cycle": delta.get(a.chip, 0),
                }
                for a in after
            ],
            requests=outcomes,
            latency=latency,
            new_violations=len(found),
        )
        self.events.write(
            "unloaded",
            cycle=cyc.index,
            seconds=round(seconds, 4),
            drained_in_time=drained,
            memory=[d.document() for d in drifts],
            counters=cyc.doc["counters"],
            requests=outcomes,
        )
        return True

    def _on_result(self, res: EngineResult) -> None:
        at = self.now_s()
        self.requests.add(res, at)
        cycle = self.cycle_index()
        sup = self.sup
        newest = (
            sup.workers[res.record.alias].generation if sup is not None and res.record.alias in sup.workers else None
        )
        found = checks.check_request(res, cycle=cycle, at_s=at) + checks.check_generations(
            res, newest, cycle=cycle, at_s=at
        )
        if res.record.kind == "invalid" and (res.token_generations or res.record.outcome in _ADMITTED_OUTCOMES):
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
        for v in found:
            self.violate(v)

    def _final_checks(self, sup: DeviceSupervisor) -> None:
        at = self.now_s()
        with self.requests.lock:
            open_requests = self.requests.outstanding
        if open_requests:
            self.violate(
                checks.Violation(
                    "requests_open", f"{open_requests} request(s) never ended", self.cycle_index(), at, subject="end"
                )
            )
        for alias, w in sup.workers.items():
            if w.live_requests() and self.interrupted is not None:
                # A signal cut the soak short: its clients were cancelled, not drained, so requests the engine
                # still holds (waiting for a load the signal stopped) are what the interrupt left, failed at
                # shutdown, not a finding of a final drain that never ran (requests.open counts the clients').
                left = self.interrupted.setdefault("engine_requests_left", {})
                left[alias] = w.live_requests()
                self.events.write("requests_cut_short", alias=alias, engine_requests=w.live_requests())
            elif w.live_requests():
                self.violate(
                    checks.Violation(
                        "requests_open",
                        f"{alias}: the engine still holds {w.live_requests()} request(s) after the final drain",
                        self.cycle_index(),
                        at,
                        subject=f"{alias}:end",
                    )
                )
        explained = self._injected_runtime_faults()
        errors = self._device_errors(sup)
        device_errors = int(sum(errors.values(), 0))
        device_error_requests = self.requests.by_outcome[RequestOutcome.DEVICE_ERROR.value]
        if not explained and (device_errors or device_error_requests):
            self.violate(
                checks.Violation(
                    "unexpected_errors",
                    f"{device_errors} device error(s) and {device_error_requests} request(s) failed "
                    f"on the device ({', '.join(f'{k}={v}' for k, v in sorted(errors.items())) or 'by request'}) "
                    "with no injected fault to explain them",
                    self.cycle_index(),
                    at,
                    subject="device",
                )
            )
        if not explained and self.drain_deadline_hits:
            self.violate(
                checks.Violation(
                    "drain_deadline",
                    f"{self.drain_deadline_hits} unload(s) missed the drain deadline "
                    f"of {self.config.drain_deadline_s:g} s with no injected fault",
                    self.cycle_index(),
                    at,
                    subject="drain",
                )
            )

    def _injected_runtime_faults(self) -> int:
        rt = self.rt
        if not isinstance(rt, FaultInjecting):
            return 0
        return sum(1 for f in rt.injected_faults() if f.kind.value not in ("memory_leak", "host_memory_leak"))

    def _host_rss_doc(self) -> dict[str, Any]:
        ref = self.host_rss[0][1] if self.host_rss else None
        known = [r for _, r in self.host_rss if r is not None]
        return {
            "reference_bytes": ref,
            "limit_bytes": checks.host_rss_limit_bytes(ref) if ref is not None else None,
            "max_growth_bytes": max(known) - ref if ref is not None and known else None,
            "after_unload": [{"cycle": c, "rss_bytes": r} for c, r in self.host_rss[-2000:]],
            "rule": "after every unload, the serving process's VmRSS within max(64 MiB, 10 %) of its VmRSS after "
            "the first cycle's unload (issue 32: a host-side leak is a violation like a device-side one)",
        }

    @staticmethod
    def _device_errors(sup: DeviceSupervisor) -> dict[str, int]:
        return {
            f"{labels['model']}/{labels['error']}": int(v)
            for labels, v in _samples(sup, "calctl_device_errors_total")
            if v
        }

    # -- report ------------------------------------------------------------------------------------

    def _files(self) -> dict[str, str | None]:
        c = self.config
        return {
            "report": str(c.out_dir / evidence.REPORT_FILE),
            "events": str(c.out_dir / evidence.EVENTS_FILE),
            "plot": None,
        }

    def _plot(self) -> dict[str, str | None]:
        c = self.config
        files: dict[str, str | None] = {
            "report": str(c.out_dir / evidence.REPORT_FILE),
            "events": str(c.out_dir / evidence.EVENTS_FILE),
            "plot": None,
        }
        try:
            fig = evidence.soak_figure(
                memory=self.memory_series,
                baseline={m.chip: m.used_bytes for m in self.baseline},
                limits={
                    m.chip: checks.drift_limit_bytes(m.total_bytes) if m.total_bytes else None for m in self.baseline
                },
                latency=self.requests.latency,
                cycles=[(cy.loaded_s, cy.unloaded_s) for cy in self.cycles if cy.loaded_s is not None],
                title=self._plot_title(),
                device=c.device.kind.value,
                checks=self._unload_checks(),
                interrupted=(self.interrupted["at_s"], self.interrupted["signal"]) if self.interrupted else None,
                ended=self.requests.ended,
                counts=dict(self.requests.by_outcome),
                sent=self.requests.sent,
                error=self.header.get("error"),
            )
            save(fig, c.out_dir / evidence.PLOT_FILE, layout=False)
            files["plot"] = str(c.out_dir / evidence.PLOT_FILE)
        except Exception as exc:
            self.events.write("plot_failed", error=f"{type(exc).__name__}: {exc}")
        return files

    def _unload_checks(self) -> dict[int, list[tuple[float, int | None]]]:
        """Per chip: (time, drift) of every after-unload memory check (001 §13.3), for the picture."""
        out: dict[int, list[tuple[float, int | None]]] = {}
        for cy in self.cycles:
            if cy.unloaded_s is None:
                continue
            for d in cy.doc.get("memory_after_unload", []):
                out.setdefault(int(d["chip"]), []).append((cy.unloaded_s, d["drift_bytes"]))
        return out

    def _plot_title(self) -> str:
        c = self.config
        planned = f" of {c.cycles} planned" if c.cycles is not None else ""
        title = f"calctl soak: {self.cycles_done} complete load/unload cycle(s){planned}"
        i = self.interrupted
        if i is not None:
            cut = f"; cycle {i['cycle']} cut short while {i['phase']}" if i["cycle"] is not None else ""
            title += f" - INTERRUPTED by {i['signal']} at {i['at_s']:.1f} s{cut}"
        return title

    def document(self) -> dict[str, Any]:
        """``soak-report.json``: the report's JSON form (a checkpoint while it runs, verdict RUNNING)."""
        return self.report().document()

    def report(self) -> Report:
        c = self.config
        sup = self.sup
        with self.requests.lock:
            req: dict[str, Any] = {
                "sent": self.requests.sent,
                "open": self.requests.outstanding,
                "by_outcome": dict(self.requests.by_outcome),
                "by_model": {a: dict(v) for a, v in self.requests.by_alias_outcome.items()},
                "by_kind": {k: dict(v) for k, v in self.requests.by_kind_outcome.items()},
            }
            reasons = dict(self.requests.device_error_reasons)
        violations = self.violations.documents()
        stale_dropped = (
            {labels["model"]: int(v) for labels, v in _samples(sup, "calctl_stale_completions_total")} if sup else {}
        )
        delivered = sum(v["occurrences"] for v in violations if v["kind"] == "stale_generation")
        limits = {m.chip: checks.drift_limit_bytes(m.total_bytes) if m.total_bytes else None for m in self.baseline}
        files = self.header.get("files") or {
            "report": str(c.out_dir / evidence.REPORT_FILE),
            "events": str(c.out_dir / evidence.EVENTS_FILE),
            "plot": None,
        }
        header = build_header(
            "soak",
            started_at=self.started_at,
            device=c.device.kind.value,
            device_options=c.device.describe(),
            versions=self.header.get("runtime"),
            package=self.header.get("package"),
            validation=self.header.get("validation"),
        )
        header.setdefault("package", None)
        header.setdefault("validation", None)
        body: dict[str, Any] = {
            "status": self.status,
            "ok": self.status == "finished" and not violations if self.phase == "done" else None,
            "interrupted": self.interrupted,
            "cycles": self.cycles_done,
            "cycles_planned": c.cycles,
            "hours_planned": c.hours,
            "seconds": round(self.end_s if self.end_s is not None else self.now_s(), 3),
            "settings": {
                "traffic": c.traffic.value,
                "traffic_seconds": c.traffic_seconds,
                "clients_per_model": c.clients_per_model,
                "seed": c.seed,
                "inject": sorted(i.value for i in c.inject),
                "warmup_iterations": c.warmup_iterations,
                "drain_deadline_s": c.drain_deadline_s,
                "checkpoint_interval_s": c.checkpoint_interval_s,
            },
            "violations": violations,
            "requests": req,
            "errors": {
                "requests": {k: v for k, v in req["by_outcome"].items() if k not in ("ok", "cancelled")},
                "device_error_reasons": reasons,
                "device_errors": self._device_errors(sup) if sup else {},
                "lifecycle": dict(self.lifecycle_errors),
                "already_configured": sum(
                    v for k, v in self.lifecycle_errors.items() if k.endswith("AlreadyConfigured")
                ),
                "stale_completions_dropped": stale_dropped,
                "stale_completions_delivered": delivered,
                "drain_deadline_hits": self.drain_deadline_hits,
                "recoveries": [_recovery_doc(r) for r in sup.recoveries] if sup else [],
            },
            "memory": {
                "baseline": [_mem_doc(m) for m in self.baseline],
                "drift_limit_bytes": limits,
                "max_drift_bytes": {str(k): v for k, v in self.max_drift.items()},
                "rule": "after every unload, each chip within max(64 MiB, 1 % of its local DRAM) of the baseline "
                "measured before the first load (001 §13.3)",
                "host_rss": self._host_rss_doc(),
            },
            "cycle_records": [
                dict(cycle=cy.index, started_s=round(cy.started_s, 3), **cy.doc) for cy in self.cycles[-2000:]
            ],
            "cycle_records_truncated": len(self.cycles) > 2000,
            "files": files,
        }
        return Report(
            "soak",
            self.verdict(),
            header,
            body,
            reasons=tuple(f"{v['kind']}: {v['message']}" for v in violations[:10]),
            error=self.header.get("error"),
            seconds=body.pop("seconds"),
            evidence={k: v for k, v in files.items() if k != "plot" and v},
            pictures={"plot": files["plot"]} if files.get("plot") else {},
        )


def _golden_warmup_seconds(events: list[Any]) -> dict[str, float | None]:
    """Per alias: Warming -> Ready in the supervisor's history (golden + warm-up before Ready, 001 §11.1)."""
    warming: dict[str, float] = {}
    out: dict[str, float | None] = {}
    for e in events:
        if e.state == "Warming":
            warming[e.alias] = e.at
        elif e.state == "Ready" and e.alias in warming:
            out[e.alias] = round(e.at - warming[e.alias], 4)
    return out


def _counters(rt: Any) -> list[ChipCounters]:
    try:
        return list(rt.counters())
    except RuntimeLayerError:
        return []


def _mem_doc(m: ChipMemory) -> dict[str, Any]:
    return {"chip": m.chip, "used_bytes": m.used_bytes, "total_bytes": m.total_bytes}


def _recovery_doc(r: Any) -> dict[str, Any]:
    return {
        "alias": r.alias,
        "reason": r.reason,
        "runtime_status": r.runtime_status,
        "scope": r.scope,
        "affected_aliases": list(r.affected_aliases),
        "ok": r.ok,
        "seconds": round(r.seconds, 4),
        "detail": r.detail,
    }


def _samples(sup: DeviceSupervisor | None, family: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every ``family`` sample in the engine's metrics (counters: the ``_total`` samples)."""
    if sup is None:
        return []
    out: list[tuple[dict[str, str], float]] = []
    for metric in sup.metrics.registry.collect():
        for s in metric.samples:
            if s.name == family and not math.isnan(s.value):
                out.append((dict(s.labels), s.value))
    return out


def run_soak(config: SoakConfig, *, on_progress: Callable[[SoakProgress], None] | None = None) -> Report:
    """Run the soak of ``config``; always returns a report (and leaves it on disk) unless the package is refused
    up front (CheckFailed, exit 1) or the options are wrong (UsageError, exit 2)."""
    return _Soak(config, on_progress).run()


__all__ = [
    "Injection",
    "SoakConfig",
    "SoakProgress",
    "Traffic",
    "default_report_dir",
    "run_soak",
]
