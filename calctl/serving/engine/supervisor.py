"""DeviceSupervisor: the one owner of the board and of the model lifecycle (001 §4, §10.2, §11; 000 §10–§12).

* **Load** follows the 11 steps of 000 §11: resolve the trusted package, verify
  signature and hashes and run the static validator (one call:
  ``calctl.package.validate``), plan capacity per chip (``calctl.budget``),
  take the lifecycle lock, drain what is served, create the calbin and
  configure once, cross-check tensors/profiles with the configuration, run
  golden + warm-up per alias, then publish every alias atomically; the previous
  package stays referenced for rollback.
* **Unload** drains with a deadline (000 §12); jobs still in flight at the
  deadline make the model Recovering (buffers are never freed under a job).
* A combined package is one calbin: reload or unload of either alias
  reconfigures the whole package and both aliases stop together (001 §11.2).
* **Recovery** (001 §11.3): an engine core reports a timeout or fault. Until fault
  injection on that board proves otherwise every runtime timeout or crash may
  have touched the whole board, so the default scope is the **board**: every
  alias goes Draining -> Recovering, the board is reset and reconfigured, each
  alias re-runs golden + warm-up and is republished under a new generation; an
  alias whose golden answer is then wrong goes Failed alone (the others, whose
  own goldens passed, are Ready), a device error during them fails them all.
  Chip scope only when ``recovery.allow_session_reset`` is true **and** the
  runtime grants it (only an F2 grade measured on that board justifies it).
  A chip reset the runtime refuses becomes a board reset only after every other
  alias is drained too (001 §11.2). A reset that fails takes every alias out of
  service and tries a device-level (board) reset; if that fails too, every
  alias is Failed with the reason. Evidence: :mod:`calctl.serving.engine.recovery`.

The lifecycle lock is held for load/unload/reset only, never around a normal
wait (001 §10.3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from calctl.budget import BudgetPolicy
from calctl.errors import CalctlError
from calctl.package.model import Package
from calctl.runtime.calbin import Calbin
from calctl.runtime.errors import DeviceLost, NotConfigured, NotSupported, RuntimeLayerError, RuntimeStatus
from calctl.runtime.interface import Runtime
from calctl.serving.config import (
    DualModelConfig,
    SchedulerConfig,
)
from calctl.serving.core.admission import ModelState
from calctl.serving.engine.bounded_log import (
    HISTORY_BYTES,
    HISTORY_ENTRIES,
    RECOVERY_BYTES,
    RECOVERY_ENTRIES,
    BoundedLog,
)
from calctl.serving.engine.device_check import halted_chips, memory_by_chip, verify_device
from calctl.serving.engine.gate import golden_and_warmup, verify_each
from calctl.serving.engine.load_check import LoadCheck
from calctl.serving.engine.loop import CoreOptions, EngineCore, RecoveryRequest
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.options import LifecycleEvent, LoadedPackage, LoadPolicy, SupervisorOptions
from calctl.serving.engine.packages import admin_package_path, check_compatible, resolve_package
from calctl.serving.engine.recovery import (
    RecoveryPolicy,
    RecoveryQueue,
    RecoveryRecord,
    effective_policy,
    evidence_document,
    status_name,
    write_evidence,
)
from calctl.serving.text import TextCodec
from calctl.signing.policy import TrustPolicy

log = logging.getLogger("calctl.serve")


class DeviceSupervisor:
    def __init__(
        self,
        rt: Runtime,
        *,
        trust: TrustPolicy,
        dual_config: DualModelConfig | None = None,
        scheduler_configs: dict[str, SchedulerConfig] | None = None,
        options: SupervisorOptions | None = None,
        metrics: EngineMetrics | None = None,
        core_options: CoreOptions | None = None,
        budget_policy: BudgetPolicy | None = None,
        load_policy: LoadPolicy | None = None,
    ) -> None:
        self.rt = rt
        self.trust = trust
        self.dual_config = dual_config
        self.scheduler_configs = scheduler_configs or {}
        self.options = options or SupervisorOptions()
        self.metrics = metrics or EngineMetrics()
        self.core_options = core_options or CoreOptions(job_timeout_s=self.options.job_timeout_s)
        self.budget_policy = budget_policy or BudgetPolicy()
        self.load_policy = load_policy or LoadPolicy()
        self._cores: dict[str, EngineCore] = {}  # one engine core per alias (read through .cores)
        self.loaded: LoadedPackage | None = None
        self.previous: LoadedPackage | None = None  # 000 §11 step 11: retained for rollback
        self.startup_source: Path | None = None  # the package given to start(): an admin load may always name it
        self.unloaded: LoadedPackage | None = None  # the package an unload took down: what a bare load brings back
        # The calbin this supervisor created last and has not released: the configured one while serving. Every
        # path that drops the configuration (unload, reload, rollback, a board reset) releases it, so the old
        # generation's calbin, the backend's prepared weights and the vendor's handle go with it (000 §12).
        self._calbin: Calbin | None = None
        self._idle_memory: dict[int, int | None] = {}  # per chip, before the first configure (000 §12 check)
        # Both bounded by count and bytes, newest kept; positions absolute (calctl.serving.engine.bounded_log).
        self.recoveries: BoundedLog[RecoveryRecord] = BoundedLog(RECOVERY_ENTRIES, RECOVERY_BYTES)
        self.evidence: list[dict[str, Any]] = []  # the last recoveries' evidence documents
        self.failures: dict[str, str] = {}  # alias -> why it is Failed
        self.history: BoundedLog[LifecycleEvent] = BoundedLog(HISTORY_ENTRIES, HISTORY_BYTES)
        self._lifecycle = threading.Lock()
        self._generation = 0
        self._resets: deque[float] = deque()
        self._closed = False
        self._recovery_queue = RecoveryQueue()  # handled one at a time by the thread below
        self._recovery_thread = threading.Thread(target=self._recovery_loop, name="supervisor-recovery", daemon=True)
        self._recovery_thread.start()

    @property
    def cores(self) -> Mapping[str, EngineCore]:
        """The engine core of each alias, read-only: what runners and the router read (one per alias once
        :meth:`start` ran; empty before). Only the supervisor adds or removes a core."""
        return MappingProxyType(self._cores)

    # ------------------------------------------------------------------ helpers

    def _event(self, alias: str, state: ModelState | str, detail: str = "") -> None:
        name = state.value if isinstance(state, ModelState) else state
        self.history.append(LifecycleEvent(time.monotonic(), alias, name, detail))
        log.info("model %s -> %s %s", alias, name, detail)

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def _set_all(self, state: ModelState, *, admission: ModelState | None = None, detail: str = "") -> None:
        for alias, w in self._cores.items():
            w.set_state(state, admission=admission)
            self._event(alias, state, detail)

    # ------------------------------------------------------------------ load (000 §11)

    def _discard(self, lp: LoadedPackage | None) -> None:
        """Remove the extracted copy of a tar package nothing holds any more (refused, or dropped from the
        retained previous slot), so repeated admin loads of tars do not fill the disk."""
        if lp is None or lp.temp_dir is None:
            return
        if any(lp is kept for kept in (self.loaded, self.previous, self.unloaded)):
            return
        shutil.rmtree(lp.temp_dir, ignore_errors=True)

    def _check(self, lp: LoadedPackage) -> dict[str, Any]:
        """Steps 2–4 and 8's static half (:class:`calctl.serving.engine.load_check.LoadCheck`)."""
        return self._checker().check(lp)

    def _scheduler_configs(self, pkg: Package) -> dict[str, SchedulerConfig]:
        return self._checker().configs(pkg)

    def _checker(self) -> LoadCheck:
        return LoadCheck(
            self.rt, self.trust, self.dual_config, self.scheduler_configs, self.budget_policy, self.load_policy
        )

    def start(self, source: Path) -> None:
        """Initial load: create one engine core per alias, then load. Requests may wait (WaitingModel) meanwhile."""
        self.startup_source = Path(source)
        lp = resolve_package(source)
        for m in lp.package.models:
            self._event(m.alias, ModelState.VALIDATING, str(source))  # 001 §11.1 Unloaded -> Validating
        settings = self._check_or_fail(lp, initial=True)
        configs = self._scheduler_configs(lp.package)
        for m in lp.package.models:
            codec = TextCodec.from_files(
                lp.root / m.tokenizer.file,
                lp.root / m.tokenizer.config if m.tokenizer.config else None,
                m.architecture.eos_token_id,
            )
            self._cores[m.alias] = EngineCore(
                m.alias,
                m,
                codec,
                settings[m.alias],
                self.metrics,
                on_recovery=self._recovery_queue.post,
                options=self._core_options(lp.package, m.alias, configs[m.alias]),
            )
        self._set_all(ModelState.CONFIGURING)
        self._idle_memory = memory_by_chip(self.rt)
        with self._lifecycle:
            self._configure_and_publish(lp)

    def _core_options(self, pkg: Package, alias: str, config: SchedulerConfig) -> CoreOptions:
        """The alias's ``executor`` block (000 §15) on top of the engine-wide core options."""
        chips = set(pkg.model(alias).target_chips)
        alone = not any(chips & set(m.target_chips) for m in pkg.models if m.alias != alias)
        e = config.executor
        return dataclasses.replace(
            self.core_options,
            mode=e.effective_mode,
            fixed_engine=e.fixed_engine,
            downgrade=e.downgrade,
            chip_exclusive=alone,
        )

    def _check_or_fail(self, lp: LoadedPackage, *, initial: bool) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            return self._check(lp)
        finally:
            for m in lp.package.models:
                self.metrics.lifecycle.labels(m.alias, "validate").observe(time.monotonic() - t0)

    def _configure_and_publish(self, lp: LoadedPackage) -> None:
        """Steps 7–10 under the lifecycle lock. On failure the new configuration is cleaned up and re-raised."""
        t0 = time.monotonic()
        try:
            halted = halted_chips(self.rt)
            if halted:
                # A fault whose recovery has not run (or was refused by the reset budget): an operator's load or
                # reload configures the board, and a halted chip refuses that, so the board is reset first.
                log.warning(
                    "configure of %s on a halted board (%s): resetting the board first", lp.source, "; ".join(halted)
                )
                self._reset("board", None)
            self._configure_new(lp.package)
        except BaseException as exc:
            # 001 §11.1: Configuring -> Failed with the reason, never left in Configuring (a faulted board
            # refuses configure with DeviceLost until it is reset).
            self._failed_load(f"configure of {lp.source} failed: {exc}")
            raise
        for alias in self._cores:
            self.metrics.lifecycle.labels(alias, "configure").observe(time.monotonic() - t0)
        try:
            gen = self._next_generation()
            self._set_all(ModelState.WARMING, admission=ModelState.WARMING)
            self._golden_and_warmup(lp.package, list(self._cores), gen)
        except BaseException as exc:
            self._failed_load(f"golden/warmup failed ({lp.source}): {exc or type(exc).__name__}")
            with contextlib.suppress(RuntimeLayerError):
                self.rt.reset_configuration()
            self._release_calbin()
            raise
        for alias, w in self._cores.items():
            self.failures.pop(alias, None)
            w.publish(self.rt, gen)
            self._event(alias, ModelState.READY, f"generation {gen}, package {lp.digest}")
        if self.loaded is not None and self.loaded is not lp:
            dropped, self.previous, self.loaded = self.previous, self.loaded, lp
            self._discard(dropped)
        self.loaded = lp

    def _configure_new(self, pkg: Package) -> None:
        """Create ``pkg``'s calbin and make it current. The one held before is released first: every caller
        comes here after a teardown or a board reset dropped its configuration, and nothing in flight holds it
        (000 §12). A calbin the device refused to configure is released at once."""
        self._release_calbin()
        self._calbin = self.rt.create_calbin(pkg)
        try:
            self.rt.configure(self._calbin)
        except BaseException:
            self._release_calbin()
            raise

    def _release_calbin(self) -> None:
        """Release the calbin this supervisor holds (000 §12 "destroy ... Calbin"): at once when the device no
        longer has it configured, else when the configuration is next dropped (the runtime keeps a released
        current calbin until then, :mod:`calctl.runtime.bookkeeping`). A backend that fails to give the handle
        back is logged: the lifecycle goes on, the configuration is already gone."""
        calbin, self._calbin = self._calbin, None
        if calbin is None:
            return
        try:
            calbin.close()
        except RuntimeLayerError as exc:
            log.warning("release of calbin %d (%s) failed: %s", calbin.id, calbin.package.name, exc)

    def _failed_load(self, reason: str) -> None:
        """A load step failed after validation: every alias Failed with ``reason`` (/health/ready, metrics).
        A rollback that then succeeds publishes the aliases again and clears it."""
        for alias, w in self._cores.items():
            self.failures[alias] = reason
            w.set_state(ModelState.FAILED)
            self._event(alias, ModelState.FAILED, reason)

    def _golden_and_warmup(self, pkg: Package, aliases: list[str], gen: int) -> None:
        """Step 9 (:func:`calctl.serving.engine.gate.golden_and_warmup`): Ready only after both pass."""
        golden_and_warmup(self.rt, pkg, aliases, gen, self.options, self.metrics)

    # ------------------------------------------------------------------ drain / unload (000 §12)

    def _drain(self, deadline_s: float) -> bool:
        """Stop admission (503), let admitted requests finish; True when everything drained in time."""
        self._set_all(ModelState.DRAINING)
        t0 = time.monotonic()
        end = t0 + deadline_s
        while time.monotonic() < end:
            if all(w.drained() for w in self._cores.values()):
                break
            time.sleep(0.01)
        ok = all(w.drained() for w in self._cores.values())
        for alias in self._cores:
            self.metrics.lifecycle.labels(alias, "drain").observe(time.monotonic() - t0)
        return ok

    def _teardown(self, reason: str) -> None:
        """After a drain: free every sequence and the configuration; a job still in flight forces a board reset
        first. 001 §11.1: Draining -> Unloading only at zero in flight; with jobs in flight at the deadline
        Draining -> Recovering (the reset aborts them), then Unloading."""
        t0 = time.monotonic()
        stuck = any(w.inflight() or w.quarantined() for w in self._cores.values())
        for w in self._cores.values():
            w.retire(reason)
        if stuck:
            # 000 §12: never free a buffer a job still holds -> Recovering, reset per contract.
            self._set_all(ModelState.RECOVERING, detail="drain deadline reached with jobs in flight")
            self._reset("board", None)
        self._set_all(ModelState.UNLOADING, detail=reason)
        for w in self._cores.values():
            w.forget_device_state()
        try:
            self.rt.reset_configuration()
        except NotConfigured:
            # Expected after a board reset (it drops the configuration with everything else): nothing to free.
            log.info("no calbin is configured any more (a board reset dropped it): nothing to reset")
        except RuntimeLayerError as exc:
            log.warning("reset_configuration failed unexpectedly (%s); resetting the board to free it", exc)
            self._reset("board", None)
        self._release_calbin()  # after the last job of the generation ended: drained, or aborted by the reset
        for alias in self._cores:
            self.metrics.lifecycle.labels(alias, "unload").observe(time.monotonic() - t0)

    def unload(self, alias: str | None = None) -> dict[str, Any]:
        """Unload the package (a combined package unloads as a whole, 001 §11.2)."""
        with self._lifecycle:
            if self.loaded is None:
                return {"ok": False, "action": "unload", "detail": "nothing is loaded"}
            drained = self._drain(self.options.drain_deadline_s)
            self._teardown("unload")
            for w in self._cores.values():
                w.detach()
            self.unloaded, self.loaded = self.loaded, None
            check = self.verify_device()  # 000 §12: "verify device memory/health" -> Unloaded
            out = {
                "ok": check["ok"],
                "action": "unload",
                "aliases": list(self._cores),
                "drained_in_time": drained,
                "device_check": check,
            }
            if not check["ok"]:
                detail = "unload left the device unclean: " + "; ".join(check["problems"])
                out["detail"] = detail
                if self.load_policy.fail_unclean_unload:
                    log.error(detail)
                    self._set_all(ModelState.FAILED, detail=detail)
                    return out
                log.warning("%s (reported only)", detail)
                out["ok"] = True
            self._set_all(ModelState.UNLOADED, detail="" if check["ok"] else "device check failed")
            return out

    def verify_device(self) -> dict[str, Any]:
        """000 §12 after an unload (:func:`calctl.serving.engine.device_check.verify_device`)."""
        return verify_device(self.rt, self._idle_memory)

    def load(self, source: Path | None = None) -> dict[str, Any]:
        """Load a package while nothing is loaded, through the 11 steps of 000 §11 (golden + warm-up before
        publish). ``source`` None: the package the last unload took down, else the start-up package. When the
        new package fails after configure, the one the unload took down is configured again in the same call
        (000 §11 step 11) and the response says so."""
        with self._lifecycle:
            if self.loaded is not None:
                return {"ok": False, "action": "load", "detail": "a package is loaded; use reload"}
            fallback = self.unloaded
            target = Path(source) if source is not None else (fallback.source if fallback else self.startup_source)
            if target is None:
                return {"ok": False, "action": "load", "detail": "nothing to load: name a package"}
            lp = None
            try:
                lp = resolve_package(target)  # step 1
                self._set_all(ModelState.VALIDATING, detail=str(lp.source))  # 001 §11.1: shown while checked
                self._check(lp)  # steps 2-4 (and 8's static half)
                check_compatible(lp, {a: c.model for a, c in self._cores.items()})
            except CalctlError as exc:
                self._discard(lp)
                self._set_all(ModelState.UNLOADED, detail=f"load refused: {exc}")
                return {"ok": False, "action": "load", "detail": str(exc), "serving": "nothing (unloaded)"}
            self._set_all(ModelState.CONFIGURING)
            try:
                self._configure_and_publish(lp)  # steps 7-10
            except CalctlError as exc:
                if fallback is None or fallback.root == lp.root:
                    self._discard(lp)
                    raise
                log.error("load of %s failed (%s); rolling back to %s", lp.source, exc, fallback.source)
                self._set_all(ModelState.CONFIGURING, detail="rollback")
                self._configure_and_publish(fallback)
                self.unloaded = None
                self._discard(lp)
                return {
                    "ok": False,
                    "action": "load",
                    "detail": str(exc),
                    "serving": "rolled back to the previous package",
                    "digest": fallback.digest,
                }
            dropped = None
            if fallback is not None and fallback.root != lp.root:
                dropped, self.previous = self.previous, fallback  # step 11: the unloaded one is the rollback
            self.unloaded = None
            self._discard(dropped)
            if fallback is not None and fallback is not self.previous:
                self._discard(fallback)
            return {"ok": True, "action": "load", "generation": self._generation, "digest": lp.digest}

    def rollback(self) -> dict[str, Any]:
        """One call back to the retained previous package (000 §11 step 11): the reload (or, after an unload,
        the load) steps with it, golden + warm-up before publish. The package rolled back from is retained."""
        prev = self.previous
        if prev is None:
            return {"ok": False, "action": "rollback", "detail": "no previous package is retained"}
        out = self.load(prev.source) if self.loaded is None else self.reload(prev.source)
        return {**out, "action": "rollback", "package": str(prev.source)}

    def resolve_admin_package(self, package: str) -> Path:
        """The path an admin load or reload names, if this server may load it
        (:func:`calctl.serving.engine.packages.admin_package_path`): under a ``--package-root``, or a package
        this server served (start-up, current, previous, unloaded)."""
        served = [self.startup_source] + [x.source for x in (self.loaded, self.previous, self.unloaded) if x]
        return admin_package_path(package, served, self.load_policy.package_roots)

    def reload(self, source: Path | None = None) -> dict[str, Any]:
        """Replace the served package. A failed check keeps the old generation serving (000 §11)."""
        current = self.loaded
        target = Path(source) if source else (current.source if current else None)
        if target is None:
            return {"ok": False, "action": "reload", "detail": "nothing to reload"}
        lp = None
        try:
            lp = resolve_package(target)
            self._check(lp)  # steps 2–4 outside the lock: the old generation keeps serving meanwhile
            check_compatible(lp, {a: c.model for a, c in self._cores.items()})
        except CalctlError as exc:
            self._discard(lp)
            return {"ok": False, "action": "reload", "detail": str(exc), "serving": "previous generation"}
        with self._lifecycle:
            if self.loaded is not current:
                self._discard(lp)
                # A load, unload or reload ran while this one was checked: going on would undo it, and roll
                # back (on failure) to a package that is no longer the served one.
                return {
                    "ok": False,
                    "action": "reload",
                    "detail": "the served package changed while this reload was checked (a concurrent load, "
                    "unload or reload); nothing was changed by this call, retry it if it is still wanted",
                }
            for w in self._cores.values():
                w.set_rejecting(True)  # 503 for new requests during the reload
            try:
                if current is not None:
                    self._drain(self.options.drain_deadline_s)
                    self._teardown("reload")
                self._set_all(ModelState.CONFIGURING, admission=ModelState.UNLOADING)
                try:
                    self._configure_and_publish(lp)
                except CalctlError as exc:
                    if current is None:
                        raise
                    # Roll back to the retained artifact (000 §11 step 11).
                    log.error("reload failed (%s); rolling back to %s", exc, current.source)
                    self._set_all(ModelState.CONFIGURING, admission=ModelState.UNLOADING, detail="rollback")
                    self._configure_and_publish(current)
                    self._discard(lp)
                    return {
                        "ok": False,
                        "action": "reload",
                        "detail": str(exc),
                        "serving": "rolled back to the previous package",
                    }
            finally:
                for w in self._cores.values():
                    w.set_rejecting(False)
            return {"ok": True, "action": "reload", "generation": self._generation, "digest": lp.digest}

    # ------------------------------------------------------------------ recovery (001 §11.3)

    def recovery_pending(self) -> bool:
        """A recovery was asked for and has not ended yet (queued or running): the aliases are not settled."""
        return self._recovery_queue.pending

    def _recovery_loop(self) -> None:
        """The supervisor's lifecycle thread for recoveries: one at a time, in the order the cores asked."""
        while True:
            req = self._recovery_queue.get()
            if req is None:
                return
            try:
                self.recover(req)
            except Exception as exc:  # a bug in the recovery: logged here, and no alias is left mid-recovery
                log.exception("recovery of %s failed with an unexpected error", req.alias)
                self._fail_unfinished(req, exc)
            finally:
                self._recovery_queue.done()

    def _fail_unfinished(self, req: RecoveryRequest, exc: Exception) -> None:
        """An unexpected exception ended a recovery: every alias it left Draining, Recovering, Warming or
        Configuring goes Failed with the reason (001 §11.3: a recovery never leaves an alias in Recovering),
        and the attempt is recorded as a failed recovery."""
        reason = f"recovery of {req.alias} failed: internal error: {type(exc).__name__}: {exc}"
        unfinished = (ModelState.DRAINING, ModelState.RECOVERING, ModelState.WARMING, ModelState.CONFIGURING)
        try:
            with self._lifecycle:
                stuck = [a for a, w in self._cores.items() if w.state in unfinished]
                self._fail(stuck, reason)
                rec = (req.alias, req.status.value, status_name(req.runtime_status), "none", tuple(stuck))
                self.recoveries.append(RecoveryRecord(*rec, False, 0.0, time.monotonic(), reason))
        except Exception:
            log.exception("aliases of the failed recovery of %s could not be marked Failed", req.alias)

    def _reset(self, scope: str, chip: int | None) -> str:
        """Teardown's reset, nothing serving (a recovery uses :meth:`_reset_for`); a board reset that raises propagates."""
        if scope == "chip":
            try:
                self.rt.reset("chip", chip)
                return "chip"
            except (NotSupported, DeviceLost) as exc:
                log.warning("chip reset not possible (%s); resetting the board", exc)
        self.rt.reset("board", None)
        return "board"

    def _reset_for(
        self, req: RecoveryRequest, scope: str, chip: int | None, affected: list[str], tried: list[str]
    ) -> str:
        """A recovery's reset of ``scope``; ``affected`` (already drained) grows to every alias it touches.

        001 §11.2: every alias a reset touches is out of admission and drained (or its requests failed with
        the recovery status) *before* the reset call. When the runtime refuses the chip reset (a runtime with
        board resets only, or a board-scope fault), the reset becomes a board reset, so the other aliases are
        stopped and drained first; they are retired before the call, so none of them submits into the wiped
        board before the reconfigure. A reset that raises anything else propagates (a failed reset); ``tried``
        gets each scope asked for, so the caller names the one that failed."""
        if scope == "chip":
            try:
                tried.append("chip")
                self.rt.reset("chip", chip)
                return "chip"
            except (NotSupported, DeviceLost) as exc:
                log.warning(
                    "chip %s reset refused (%s): the recovery of %s widens to every alias", chip, exc, req.alias
                )
                self._widen(affected, f"board reset for {req.alias}: chip reset not possible")
        tried.append("board")
        self._board_reset(req.alias)
        return "board"

    def _board_reset(self, alias: str) -> None:
        """A recovery's board reset, logged where it happens: after every alias left service (001 §11.2), so
        the log reads Draining/Recovering of each alias, then this line, never the reset before an alias's
        Draining. A board reset that raises propagates."""
        states = ", ".join(f"{a} {w.state.value}" for a, w in self._cores.items())
        log.warning("board reset for the recovery of %s; every alias is out of service (%s)", alias, states)
        self.rt.reset("board", None)

    def _widen(self, affected: list[str], why: str) -> None:
        """Stop and drain the aliases not yet in ``affected`` (001 §11.1 Draining -> Recovering); add them."""
        others = [a for a in self._cores if a not in affected]
        if others:
            self._stop_and_drain(others, why)
            affected += others

    def policy(self, alias: str) -> RecoveryPolicy:
        """The effective ``recovery`` block for ``alias`` (:func:`calctl.serving.engine.recovery.effective_policy`)."""
        sched = self.scheduler_configs.get(alias)
        if sched is None and self.dual_config is not None:
            with contextlib.suppress(KeyError):
                sched = self.dual_config.model(alias).effective_scheduler()
        return effective_policy(self.options, sched, self.dual_config.recovery if self.dual_config else None)

    def _fail(self, aliases: list[str], reason: str) -> None:
        """Terminal: the aliases leave service with ``reason`` (shown in /health/ready and the metrics)."""
        for a in aliases:
            self.failures[a] = reason
            self._cores[a].fail_all(reason)
            self._event(a, ModelState.FAILED, reason)

    def _stop_and_drain(self, aliases: list[str], why: str, faulted: str | None = None) -> None:
        """001 §11.1 Ready -> Draining -> Recovering: stop admission, let in-flight work finish briefly, retire."""
        for a in aliases:
            self._cores[a].set_state(ModelState.DRAINING)
            self._event(a, ModelState.DRAINING, why)
        end = time.monotonic() + self.options.recovery_drain_s

        def settled(a: str) -> bool:  # the faulted core no longer serves: only its jobs in flight can finish
            w = self._cores[a]
            return w.inflight() == 0 if a == faulted else w.drained()

        while time.monotonic() < end and not all(settled(a) for a in aliases):
            time.sleep(0.01)
        for a in aliases:
            self._cores[a].set_state(ModelState.RECOVERING)
            self._event(a, ModelState.RECOVERING, why)
            self._cores[a].retire(why)

    def _save_evidence(self, req: RecoveryRequest, scope: str, affected: list[str], t0_ns: int) -> Path | None:
        """001 §11.3 "保存 trace": the trace window and job records around the fault, next to the record."""
        since = max(0, t0_ns - int(self.options.evidence_window_s * 1e9))
        try:
            raw = self.rt.trace(since_ns=since)
        except RuntimeLayerError as exc:
            raw = ()
            log.warning("recovery evidence: the runtime trace is not readable (%s)", exc)
        doc = evidence_document(
            device=self.rt.kind.value,
            alias=req.alias,
            reason=req.status.value,
            runtime_status=req.runtime_status,
            detail=req.detail,
            scope=scope,
            affected=affected,
            generations={a: w.generation for a, w in self._cores.items()},
            window_s=self.options.evidence_window_s,
            trace=raw,
            jobs={a: self._cores[a].executor_status() for a in affected},
            kept_jobs=self.metrics.records.recent("job", affected),
            kept_requests=[doc for doc, _ in self.metrics.records.recent("request", affected)],
            package_digest=self.loaded.digest if self.loaded else None,
        )
        self.evidence.append(doc)
        del self.evidence[: -self.options.evidence_keep]
        name = f"recovery-{os.getpid()}-{len(self.recoveries) + 1:04d}-{req.alias}.json"
        return write_evidence(doc, self.options.evidence_dir, name)

    def recover(self, req: RecoveryRequest) -> RecoveryRecord:
        t0 = time.monotonic()
        t0_ns = time.monotonic_ns()
        with self._lifecycle:
            if self._closed or self.loaded is None:
                return RecoveryRecord(req.alias, req.status.value, None, "none", (), False, 0.0, t0, "not serving")
            pol = self.policy(req.alias)
            core = self._cores[req.alias]
            if req.generation is not None and core.generation != req.generation and core.is_ready():
                # The fault was in a generation a later recovery (or reload) already replaced: a board-wide
                # hang times out A's and B's jobs alike, and A's board reset already reset and republished B.
                # Resetting again would cost a second reset of the budget for one fault.
                log.info(
                    "recovery of %s for generation %d skipped: generation %d already replaced it (%s)",
                    req.alias,
                    req.generation,
                    core.generation,
                    req.detail,
                )
                return RecoveryRecord(
                    req.alias, req.status.value, status_name(req.runtime_status), "none", (), True, 0.0, t0,
                    f"covered by an earlier recovery: generation {req.generation} was already replaced",
                )  # fmt: skip
            unknown_dma = req.runtime_status is RuntimeStatus.UNKNOWN_DMA_STATE
            # 001 §11.3: until fault injection proves otherwise every timeout/crash may have touched the whole
            # board. Chip scope only when the configuration allows a session reset (and the runtime grants it).
            want = "chip" if pol.allow_session_reset and len(core.chips) == 1 else "board"
            if unknown_dma and pol.restart_on_unknown_dma:
                want = "board"  # 000 §15 restart_on_unknown_dma
            # Every alias the reset touches: a chip reset touches each alias with a model on that chip (001 §11.2).
            affected = [
                a for a, w in self._cores.items() if a == req.alias or want == "board" or set(w.chips) & set(core.chips)
            ]

            def record(scope: str, ok: bool, detail: str, evidence: Path | None = None) -> RecoveryRecord:
                took = time.monotonic() - t0
                for a in affected:
                    self.metrics.recoveries.labels(a, req.status.value, scope).inc()
                    self.metrics.recovery_time.labels(a, scope, "ok" if ok else "failed").observe(took)
                rec = RecoveryRecord(
                    req.alias,
                    req.status.value,
                    status_name(req.runtime_status),
                    scope,
                    tuple(affected),
                    ok,
                    took,
                    t0,
                    detail,
                    str(evidence) if evidence else None,
                    {a: self._cores[a].generation for a in self._cores},
                )
                self.recoveries.append(rec)
                return rec

            self._stop_and_drain(affected, f"{req.status.value}: {req.detail}", req.alias)
            evidence = self._save_evidence(req, want, affected, t0_ns)
            if unknown_dma and pol.restart_process_on_unknown_dma:
                reason = "unknown DMA state: restart the serving process (recovery.restart_process_on_unknown_dma)"
                self._fail(list(self._cores), reason)
                affected = list(self._cores)
                return record("process", False, reason, evidence)
            now = time.monotonic()
            while self._resets and now - self._resets[0] > 600:
                self._resets.popleft()
            if len(self._resets) >= pol.max_resets_per_10min:
                reason = (
                    f"reset budget exhausted: {len(self._resets)} reset(s) in 10 minutes, "
                    f"recovery.max_resets_per_10min is {pol.max_resets_per_10min}"
                )
                self._fail(affected, reason)
                return record("none", False, reason, evidence)
            self._resets.append(now)
            tried: list[str] = []
            try:
                scope = self._reset_for(req, want, core.chips[0] if want == "chip" else None, affected, tried)
            except RuntimeLayerError as exc:
                # 001 §11.3 row 6: a failed reset takes both aliases out of service; device-level recovery.
                first = f"{tried[-1]} reset failed: {exc}"
                log.error("recovery of %s: %s; device-level recovery", req.alias, first)
                self._widen(affected, first)
                try:
                    self._board_reset(req.alias)
                    scope = "board"
                except RuntimeLayerError as exc2:
                    reason = f"{first}; device-level board reset failed too: {exc2}"
                    self._fail(affected, reason)
                    return record("device", False, reason, evidence)
            for a in affected:
                self._cores[a].forget_device_state()
            try:
                gen = self._next_generation()
                if scope == "board":
                    self._configure_new(self.loaded.package)  # the reset dropped (and aborted) the old one
                for a in affected:
                    self._cores[a].set_state(ModelState.WARMING, admission=ModelState.RECOVERING)
                    self._event(a, ModelState.WARMING, f"golden + warm-up after a {scope} reset")
                # 001 §13.3: golden + warm-up before Ready, alias by alias (gate.verify_each)
                wrong = verify_each(self.rt, self.loaded.package, affected, gen, self.options, self.metrics)
                for a in affected:  # each alias whose own golden passed is Ready; the others Failed, alone
                    if a in wrong:
                        continue
                    self.failures.pop(a, None)
                    self._cores[a].publish(self.rt, gen)
                    self._event(a, ModelState.READY, f"recovered, generation {gen}")
            except CalctlError as exc:
                reason = f"recovery after a {scope} reset failed: {exc}"
                self._fail(affected, reason)
                return record(scope, False, reason, evidence)
            if wrong:
                reason = f"recovery after a {scope} reset failed for {', '.join(wrong)}: {'; '.join(wrong.values())}"
                self._fail(list(wrong), reason)
                return record(scope, False, reason, evidence)
            return record(scope, True, "", evidence)

    # ------------------------------------------------------------------ shutdown

    def shutdown(self, deadline_s: float | None = None) -> bool:
        """Stop admission, drain within the deadline, release the device. True if drained cleanly."""
        with self._lifecycle:
            if self._closed:
                return True
            drained = True
            if self.loaded is not None:
                drained = self._drain(self.options.drain_deadline_s if deadline_s is None else deadline_s)
                try:
                    self._teardown("shutdown")
                except RuntimeLayerError as exc:
                    log.error("teardown at shutdown failed: %s", exc)
                self._set_all(ModelState.UNLOADED, detail="shutdown")
            for w in self._cores.values():
                w.detach()
                w.shutdown()
            self._closed = True
            self._recovery_queue.stop()
            for lp in (self.loaded, self.previous, self.unloaded):
                if lp and lp.temp_dir:
                    shutil.rmtree(lp.temp_dir, ignore_errors=True)
            return drained

    def isolation_evidence(self) -> list[dict[str, Any]]:
        return [r.__dict__ for r in self.recoveries]


__all__ = ["DeviceSupervisor"]
