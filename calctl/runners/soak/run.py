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
   failed), engine cores with nothing in flight or quarantined; and this process's
   own resident memory (VmRSS), judged at the end by its trend over the cycles
   after the warm-up (``host_memory_growth``, :mod:`.host_memory`).

The last cycle stops the traffic and lets every request finish before its
unload, so at the end nothing is left open. ``AlreadyConfigured`` or any other
load/unload failure is a violation and ends the soak. Errors are counted by
class (request outcomes, device errors by runtime status, stale completions the
engine dropped, recoveries). A device error, or a drain that missed its
deadline, is a violation unless the mock injected faults that explain it.

``--inject stale-completion`` arms the engine core's diagnostic hook
(:class:`~calctl.runners.soak.inject.StaleRedelivery`, a delivery tap): after
the first reload one token of the retired generation is delivered to a request
of the new one, and the soak must exit 1 naming it. It exists to prove the
checker, never for serving.

The soak is cut along the run: :mod:`~calctl.runners.soak.plan` (the config),
this module (the device, the cycles, the sampler and checkpoints),
:mod:`~calctl.runners.soak.clients` (the traffic and its accounting),
:mod:`~calctl.runners.soak.state` (what it has seen), :mod:`~calctl.runners.soak.judge`
(when each check applies, the verdict) and :mod:`~calctl.runners.soak.render` (the report
and picture).

Evidence (:mod:`calctl.runners.soak.evidence`): ``events.ndjson`` appended as it
happens, ``soak-report.json`` rewritten atomically at every checkpoint (every
``checkpoint_interval_s``, default 60 s) and cycle end, ``soak.png`` at the end.
Mock results are labelled as such (docs/runtime.md §5). This module does not print.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from calctl import html_report, records
from calctl.checks.steps import at_once
from calctl.errors import CalctlError, CheckFailed, Interrupted, reason_of
from calctl.package.model import Package, SectionKind
from calctl.package.reader import load_manifest, package_root
from calctl.package.validate import ValidationPolicy, validate
from calctl.report import Report, verdict_of_exit_code
from calctl.runners.serving_stack import ServingStack
from calctl.runners.soak import attribution, checks, evidence, judge, render
from calctl.runners.soak.batches import batch_configs
from calctl.runners.soak.clients import TrafficDriver
from calctl.runners.soak.inject import StaleRedelivery
from calctl.runners.soak.plan import Injection, SoakConfig, SoakProgress, Traffic, default_report_dir
from calctl.runners.soak.state import (
    Cycle,
    Interruption,
    LoadRecord,
    PackageFacts,
    SoakState,
    UnloadRecord,
    ValidationFacts,
    read_counters,
)
from calctl.runners.telemetry import telemetry_document
from calctl.runners.traffic import EngineResult
from calctl.runtime import DeviceKind
from calctl.runtime.errors import AlreadyConfigured, RuntimeLayerError
from calctl.runtime.interface import Runtime
from calctl.runtime.types import ChipCounters
from calctl.serving.core.admission import ModelState
from calctl.serving.engine import DeviceSupervisor, SupervisorOptions
from calctl.serving.protocol import GenerationRequest


class _Soak(SoakState):
    """One soak: the device opened, the sampler and checkpoints, and the cycles (load, traffic, unload)."""

    def __init__(self, config: SoakConfig, on_progress: Callable[[SoakProgress], None] | None) -> None:
        super().__init__(config)
        self.on_progress = on_progress
        self._stop_sampler = threading.Event()
        self._last_checkpoint = 0.0
        self._tapped: set[int] = set()  # engine cores whose launches the lane log sees

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
                    self.on_progress(render.progress(self))
            except Exception as exc:
                self.events.write("sampler_error", error=f"{type(exc).__name__}: {exc}")

    def checkpoint(self, why: str) -> None:
        with self._lock:
            self._last_checkpoint = self.now_s()
            doc = render.report(self).document()
            records.write_json(self.config.out_dir / evidence.REPORT_FILE, doc)
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
                _validate(self)
            except CalctlError:
                self.events.close()  # a package refused before the device: its event log ends at the refusal
                raise
            self._on_device(sampler)
        except KeyboardInterrupt as exc:  # the one place a signal becomes the INTERRUPTED report (a run driver's, #48)
            self._note_interrupt(exc)
            self.status = "interrupted"
        except CalctlError as exc:
            # The device could not be opened, or failed outside a cycle (exit 3): the report says how far it got.
            # A usage error here came up mid-run (the package vanished after the CLI checked it): ERROR, exit 3,
            # as in bringup and accept; a missing package is refused by the CLI before the run (exit 2).
            self.status = "error"
            self.error_verdict = verdict_of_exit_code(exc.exit_code)
            self.header.error = reason_of(exc)
            self.events.write("error", error=self.header.error)
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
            self.header.files = render.plot(self) if self.rt is not None else render.evidence_files(self)
            self.events.write(
                "soak_end",
                status=self.status,
                verdict=judge.verdict(self),
                ok=ok,
                cycles=self.cycles_done,
                violations=len(self.violations),
            )
            with self._lock:
                report = render.report(self)
                document = report.document()
                records.write_json(c.out_dir / evidence.REPORT_FILE, document)
                html_report.write(document, c.out_dir / evidence.REPORT_FILE)
            self.events.close()
            if self.on_progress is not None:
                self.on_progress(render.progress(self))
        return report

    def _note_interrupt(self, exc: KeyboardInterrupt) -> None:
        """Remember where SIGINT/SIGTERM arrived (the first time): the phase and the cycle it cut short."""
        if self.interrupted is not None:
            return
        cut = self.cycles[-1].index if self.cycles and self.cycles[-1].index > self.cycles_done else None
        self.interrupted = Interruption(
            signal=exc.signal_name if isinstance(exc, Interrupted) else "SIGINT",
            phase=self.phase,
            cycle=cut,
            at_s=round(self.now_s(), 3),
        )

    def _close_interrupted_cycle(self) -> None:
        """The event log and the cycle records say which cycle the interrupt cut short, and in which phase."""
        i = self.interrupted
        if i is None or i.cycle is None:
            return
        self.cycles[-1].interrupted = i
        self.events.write("cycle_interrupted", cycle=i.cycle, phase=i.phase, signal=i.signal)

    def _on_device(self, sampler: threading.Thread) -> None:
        c = self.config
        with c.device.open() as rt:
            self.rt = rt
            rt.on_submit(self.submits.count)  # every accepted submit: the engine's and golden/warm-up's
            self.header.runtime = rt.versions()
            self.topology = rt.topology()
            self.dram = dict(enumerate(self.topology.dram_bytes))
            try:
                self.baseline = list(rt.memory_usage())  # before the first load (001 §13.3)
            except RuntimeLayerError as exc:  # a runtime without per-chip memory: drift is null, never a pass
                self.events.write("memory_not_reported", error=f"{type(exc).__name__}: {exc}")
            self.max_drift = {m.chip: 0 if m.used_bytes is not None else None for m in self.baseline}
            self.events.write("baseline", memory=[render.mem_doc(m) for m in self.baseline])
            if self.manifest is not None and self.baseline and rt.kind is DeviceKind.CALRT:
                self._memory_attribution(rt, self.manifest)
            self.sample_memory()
            sampler.start()
            # Every compiled decode profile, partial batches included (batches.py): the default serves B1 only.
            configs = batch_configs(self.manifest) if self.manifest is not None else {}
            self.events.write("batch_profiles", profiles={a: list(cfg.batch.profiles) for a, cfg in configs.items()})
            options = SupervisorOptions(
                warmup_iterations=c.warmup_iterations,
                drain_deadline_s=c.drain_deadline_s,
                job_timeout_s=c.job_timeout_s,
            )
            stack = ServingStack(
                rt,
                trust=c.trust,
                name="soak-traffic",
                scheduler_configs=configs,
                options=options,
                shutdown_deadline_s=c.drain_deadline_s,
            )
            self.sup = stack.sup
            traffic: list[TrafficDriver] = []
            try:
                with contextlib.ExitStack() as on_failure:
                    # Ctrl-C/SIGTERM or a failure mid-cycle: give the clients a moment, then cancel what is left.
                    on_failure.callback(_stop_clients, traffic, 5.0)
                    try:
                        self._cycles(stack, rt, traffic)
                    except KeyboardInterrupt as exc:
                        self._note_interrupt(exc)  # before the teardown changes the phase
                        raise
                    on_failure.pop_all()
            finally:
                self.phase = "draining"
                for t in traffic:  # still running after a failed load or unload
                    self._drain_clients(t, "at the end of the soak", self.cycle_index())
                # Every client has ended (a cancelled one counted out) before the final checks read the counts; the
                # clients are stopped, so the unload that follows has no stream left to deliver into the loop.
                stack.loop.close()
                judge.final_checks(self, stack.sup)
                stack.close()
                self.sample_memory()
                telemetry_document(rt)  # the last telemetry sample while the device is open

    def _memory_attribution(self, rt: Runtime, pkg: Package) -> None:
        """A vendor shim's figures follow the models: each loaded alone, before the first load (attribution.py)."""
        found = attribution.probe(rt, pkg)
        self.events.write("memory_attribution", misattributed=[m.message() for m in found])
        for m in found:
            self.violate(
                checks.Violation(
                    "memory_figures",
                    f"{m.message()}; the soak's drift check cannot be trusted on it",
                    None,
                    self.now_s(),
                    subject=f"chip{m.chip}:attribution",
                    detail=dataclasses.asdict(m),
                )
            )

    def _last(self, index: int) -> bool:
        c = self.config
        if c.cycles is not None:
            return index == c.cycles
        assert c.hours is not None
        return self.now_s() >= c.hours * 3600

    def _cycles(self, stack: ServingStack, rt: Runtime, traffic: list[TrafficDriver]) -> None:
        """Cycle until done or a load/unload fails. ``traffic`` holds the running driver, for the caller's cleanup."""
        c, sup = self.config, stack.sup
        index = 1  # cycles are numbered from 1 in every report and message
        while True:
            cyc = Cycle(index, self.now_s())
            self.cycles.append(cyc)
            self.events.write("cycle_start", cycle=index)
            counters_before = read_counters(rt)
            submitted_before = self.submits.submitted()
            if not self._load(sup, cyc):
                return
            if index == 1 and c.traffic is Traffic.MIXED:
                if Injection.STALE_COMPLETION in c.inject:
                    for w in sup.cores.values():
                        w.add_taps(delivery=StaleRedelivery(w.alias))
                    self.events.write(
                        "inject",
                        what=Injection.STALE_COMPLETION.value,
                        detail="diagnostic: one token of a retired generation is re-delivered after the first reload",
                    )
                driver = TrafficDriver(stack.loop, stack.engine, sup, c, self._on_result, self.requests)
                self._reference_twins(sup, rt, driver)
                traffic.append(driver)
                driver.start()
            self.phase = "traffic"
            if traffic:
                self._traffic_phase(cyc)
            else:
                end = time.monotonic() + c.traffic_seconds
                while time.monotonic() < end:
                    time.sleep(min(0.05, max(0.0, end - time.monotonic())))
            last = self._last(index)
            if last and traffic:
                # The last cycle lets every request finish before its unload: nothing is left open at the end.
                self.phase = "draining"
                hung = self._drain_clients(traffic.pop(), f"after {c.request_timeout_s + 5.0:g} s", index)
                self.events.write("traffic_stopped", clients_still_running=hung)
            if not self._unload(sup, cyc, counters_before, submitted_before, rt):
                return
            self.cycles_done = index
            self.checkpoint("cycle end")
            if last:
                return
            index += 1

    def _traffic_phase(self, cyc: Cycle) -> None:
        """``traffic_seconds`` of traffic, and then until every alias has ``traffic_requests`` requests answered in
        this cycle: a floor, so a slow or loaded host checks as many answers as a fast one. A floor not reached
        within the request timeout past the seconds is a ``traffic_floor`` violation (the board answered too
        little to be judged), never a silent pass on less evidence."""
        c = self.config
        t0 = time.monotonic()
        end, ceiling = t0 + c.traffic_seconds, t0 + c.traffic_seconds + c.request_timeout_s
        while True:
            now = time.monotonic()
            short = {a: n for a, n in self._answered().items() if n < c.traffic_requests}
            if now >= end and (not short or now >= ceiling):
                break
            time.sleep(min(0.05, max(0.0, end - now)) if now < end else 0.05)
        cyc.traffic_s = round(time.monotonic() - t0, 3)
        if short:
            said = ", ".join(f"{a} {n}" for a, n in sorted(short.items()))
            self.violate(
                checks.Violation(
                    "traffic_floor",
                    f"cycle {cyc.index}: requests answered in {time.monotonic() - t0:.1f} s of traffic: {said}, "
                    f"fewer than the {c.traffic_requests} per model --traffic-requests asks for",
                    cyc.index,
                    self.now_s(),
                    subject="traffic",
                )
            )

    def _answered(self) -> dict[str, int]:
        """Per alias in service (or on its way back: a recovery), the requests answered in this cycle. An alias
        that left service (Failed) answers nothing more; what took it out is a violation of its own."""
        answered = self.requests.answered_in_cycle()
        cores = self.sup.cores if self.sup is not None else {}
        return {
            alias: answered.get(alias, 0)
            for alias, core in cores.items()
            if core.state is not ModelState.FAILED and core.failed is None
        }

    def _drain_clients(self, driver: TrafficDriver, when: str, cycle: int | None) -> int:
        """Stop ``driver`` and let its requests end (the client's limit, plus 5 s); a client still waiting is a
        ``request_hung`` violation. Returns how many clients were still running."""
        hung = driver.stop(self.config.request_timeout_s + 5.0)
        if hung:
            message = f"{hung} client(s) still had a request open {when}"
            self.violate(checks.Violation("request_hung", message, cycle, self.now_s(), subject="end"))
        return hung

    def _load(self, sup: DeviceSupervisor, cyc: Cycle) -> bool:
        c = self.config
        self.phase = "loading"
        h0 = len(sup.history)
        t = time.monotonic()
        try:
            if not sup.cores:
                sup.start(c.package)
            else:
                res = sup.load(c.package)
                if not res.ok:
                    raise CheckFailed(f"load refused: {res.detail}")
        except (CalctlError, RuntimeLayerError) as exc:
            cyc.load = LoadRecord(False, round(time.monotonic() - t, 4), error=f"{type(exc).__name__}: {exc}")
            self._lifecycle_failed(
                "load", "already_configured" if isinstance(exc, AlreadyConfigured) else None, cyc, exc
            )
            return False
        seconds = time.monotonic() - t
        cyc.loaded_s = self.now_s()
        gens = {a: w.generation for a, w in sup.cores.items()}
        gw = _golden_warmup_seconds(sup.history[h0:])
        cyc.load = LoadRecord(True, round(seconds, 4), None, gens, gw, c.warmup_iterations)
        self.events.write("loaded", cycle=cyc.index, seconds=round(seconds, 4), generations=gens, golden_warmup_s=gw)
        for alias, core in sup.cores.items():  # the lanes of every decode job, to name a wrong token's lane
            if id(core) not in self._tapped:
                self._tapped.add(id(core))
                core.add_taps(launch=self.verifier.lanes.tap(alias))
        loaded = self.sample_memory()
        if cyc.index == 1 and loaded and self.baseline and sup.loaded is not None and self.topology is not None:
            for v in checks.check_memory_units(
                self.baseline,
                loaded,
                topology=self.topology,
                weights=weights_by_chip(sup.loaded.package),
                cycle=cyc.index,
                at_s=self.now_s(),
            ):
                self.violate(v)
        return True

    def _unload(
        self,
        sup: DeviceSupervisor,
        cyc: Cycle,
        counters_before: list[ChipCounters],
        submitted_before: dict[int, int],
        rt: Runtime,
    ) -> bool:
        self.phase = "unloading"
        t = time.monotonic()
        try:
            res = sup.unload()
            if not res.ok:
                raise CheckFailed(f"unload refused: {res.detail}")
        except (CalctlError, RuntimeLayerError) as exc:
            self._lifecycle_failed("unload", None, cyc, exc)
            return False
        seconds = time.monotonic() - t
        cyc.unloaded_s = self.now_s()
        drained = res.drained_in_time is not False
        if not drained:
            self.drain_deadline_hits += 1
        checked = judge.after_unload(self, sup, rt, cyc.index, counters_before, submitted_before)
        outcomes, latency = self.requests.take_cycle()
        cyc.unload = rec = UnloadRecord(
            round(seconds, 4),
            drained,
            tuple(checked.drifts),
            checked.rss,
            tuple(checked.counters),
            checked.submitted_in_cycle,
            outcomes,
            latency,
            checked.found,
        )
        self.events.write(
            "unloaded",
            cycle=cyc.index,
            seconds=round(seconds, 4),
            drained_in_time=drained,
            memory=rec.memory_document(),
            counters=rec.counters_document(),
            requests=outcomes,
        )
        return True

    def _lifecycle_failed(self, step: str, kind: str | None, cyc: Cycle, exc: Exception) -> None:
        """A load or unload that failed: a violation (``kind``, default ``<step>_failed``) that ends the soak."""
        name = type(exc).__name__
        kind = kind or f"{step}_failed"
        self.lifecycle_errors[f"{step}:{name}"] += 1
        self.violate(
            checks.Violation(
                kind, f"cycle {cyc.index}: {step} failed: {name}: {exc}", cyc.index, self.now_s(), subject=kind
            )
        )
        self.events.write(f"{step}_failed", cycle=cyc.index, error=f"{name}: {exc}")
        self.status = "aborted"

    def _reference_twins(self, sup: DeviceSupervisor, rt: Runtime, driver: TrafficDriver) -> None:
        """Every pooled prompt's B1 twin, decoded on the board after the first load and before any traffic."""
        self.phase = "reference"
        assert sup.loaded is not None
        pkg, pools = sup.loaded.package, driver.pools()
        # One thread per alias: each model's twins on its own chip, at once (001 §6.4's A and B in parallel).
        at_once(
            lambda a: self.verifier.compute(
                rt,
                pkg,
                a,
                pools[a],
                generation=sup.cores[a].generation,
                step_timeout_s=self.config.job_timeout_s,
                seed=self.config.seed,
            ),
            list(pools),
            name="soak-twins",
        )
        for probe in self.verifier.lane_failures():  # serving packs lanes: the soak's own gapped batches (verify.py)
            detail = {"alias": probe.alias, "batch": probe.batch, "jobs": probe.jobs}
            message = f"gapped-lane probe: {probe.reason}"
            self.violate(
                checks.Violation(
                    "output_mismatch",
                    message,
                    self.cycle_index(),
                    self.now_s(),
                    subject=f"{probe.alias}:lanes",
                    detail=detail,
                )
            )
        self.events.write("reference_twins", **self.verifier.document())

    def _on_result(self, req: GenerationRequest, res: EngineResult) -> None:
        at = self.now_s()
        self.requests.add(res, at)
        cycle = self.cycle_index()
        sup = self.sup
        newest = sup.cores[res.record.alias].generation if sup is not None and res.record.alias in sup.cores else None
        for v in judge.request_violations(res, newest, cycle=cycle, at=at):
            self.violate(v)
        wrong = self.verifier.check(req, res)
        if wrong is not None:  # the board answered something its own B1 path does not (issue 50)
            self.violate(
                checks.Violation(
                    "output_mismatch",
                    wrong.message(),
                    cycle,
                    at,
                    subject=f"{wrong.alias}:output",
                    detail=dataclasses.asdict(wrong),
                )
            )


def _stop_clients(traffic: list[TrafficDriver], within_s: float) -> None:
    """Stop every running traffic driver (each waits ``within_s`` for its clients, then cancels them)."""
    for t in traffic:
        t.stop(within_s)
    traffic.clear()


def weights_by_chip(pkg: Package) -> dict[int, int]:
    """Bytes of the package's parameter sections per chip: what each chip's DRAM holds once it is loaded."""
    out: dict[int, int] = {}
    for m in pkg.models:
        for sec in m.sections:
            if sec.kind is SectionKind.PARAMS:
                for chip in range(int(sec.chip_mask).bit_length()):
                    if (int(sec.chip_mask) >> chip) & 1:
                        out[chip] = out.get(chip, 0) + int(sec.size)
    return out


def _validate(s: SoakState) -> None:
    """Validate once up front (the supervisor validates again at every load): fail before the device."""
    c = s.config
    report = validate(c.package, ValidationPolicy(trust=c.trust))
    with package_root(c.package) as root:
        pkg = load_manifest(root)
    s.manifest = pkg
    s.header.package = PackageFacts(
        path=str(c.package),
        name=pkg.name,
        version=pkg.version,
        kind=pkg.kind,
        aliases=tuple(pkg.aliases),
        digest=report.digest,
        signer_key_id=report.signer_key_id,
    )
    s.header.validation = ValidationFacts(
        ok=report.ok,
        failed_rules=tuple(report.failed_ids()),
        warnings=tuple(dict.fromkeys(x.id for x in report.warnings)),
    )
    if not report:
        s.events.write("validation_failed", failed=list(report.failed_ids()))
        raise CheckFailed(
            f"{c.package}: the package failed validation ({report.refusal()}); the soak never touched the device",
            hint=f"run `calctl validate {c.package}`",
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
