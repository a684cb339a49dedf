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
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from calctl.budget import BudgetPolicy
from calctl.errors import CalctlError
from calctl.package.model import Package
from calctl.runtime.calbin import Calbin
from calctl.runtime.errors import DeviceLost, NotConfigured, NotSupported, RuntimeLayerError
from calctl.runtime.interface import Runtime
from calctl.serving.config import (
    DualModelConfig,
    SchedulerConfig,
)
from calctl.serving.core.admission import ModelState
from calctl.serving.core.settings import SchedulerSettings
from calctl.serving.engine.board_recovery import BoardRecovery
from calctl.serving.engine.bounded_log import (
    HISTORY_BYTES,
    HISTORY_ENTRIES,
    RECOVERY_BYTES,
    RECOVERY_ENTRIES,
    BoundedLog,
)
from calctl.serving.engine.device_check import DeviceCheck, halted_chips, memory_by_chip, verify_device
from calctl.serving.engine.gate import golden_and_warmup
from calctl.serving.engine.load_check import LoadCheck
from calctl.serving.engine.loop import CoreOptions, EngineCore
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.options import LifecycleEvent, LoadedPackage, LoadPolicy, SupervisorOptions
from calctl.serving.engine.packages import admin_package_path, check_compatible, resolve_package
from calctl.serving.engine.recovery import (
    RecoveryRecord,
)
from calctl.serving.engine.results import (
    NOTHING_SERVED,
    PREVIOUS_GENERATION,
    ROLLED_BACK,
    LoadResult,
    ReloadResult,
    RollbackResult,
    UnloadResult,
)
from calctl.serving.text import TextCodec
from calctl.signing.policy import TrustPolicy

log = logging.getLogger("calctl.serve")


class DeviceSupervisor(BoardRecovery):
    """The lifecycle half (start, load, unload, reload, rollback, shutdown; 000 §11–§12) over the recovery
    half it inherits (:class:`calctl.serving.engine.board_recovery.BoardRecovery`, 001 §11.3)."""

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
        self.failures: dict[str, str] = {}  # alias -> why it is Failed
        self.history: BoundedLog[LifecycleEvent] = BoundedLog(HISTORY_ENTRIES, HISTORY_BYTES)
        self._lifecycle = threading.Lock()
        self._generation = 0
        self._closed = False
        super().__init__()  # the recovery thread, the reset budget, the evidence kept (BoardRecovery)

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

    def _check(self, lp: LoadedPackage) -> dict[str, SchedulerSettings]:
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

    def _check_or_fail(self, lp: LoadedPackage, *, initial: bool) -> dict[str, SchedulerSettings]:
        t0 = time.monotonic()
        try:
            return self._check(lp)
        finally:
            for m in lp.package.models:
                self.metrics.lifecycle.labels(m.alias, "validate").observe(time.monotonic() - t0)

    def _configure_and_publish(self, lp: LoadedPackage) -> None:
        """Steps 7–10 under the lifecycle lock. On failure the new configuration is cleaned up and re-raised,
        whatever stopped it: a device error, or the ``Interrupted`` a signal raises in the caller's thread (a
        runner's ``start``), so no alias is left Configuring or Warming (the ExitStacks' callbacks)."""
        t0 = time.monotonic()
        with contextlib.ExitStack() as failing:
            # 001 §11.1: Configuring -> Failed with the reason, never left in Configuring (a faulted board
            # refuses configure with DeviceLost until it is reset).
            failing.push(lambda _type, exc, _tb: self._failed_load(f"configure of {lp.source} failed: {exc}"))
            halted = halted_chips(self.rt)
            if halted:
                # A fault whose recovery has not run (or was refused by the reset budget): an operator's load or
                # reload configures the board, and a halted chip refuses that, so the board is reset first.
                log.warning(
                    "configure of %s on a halted board (%s): resetting the board first", lp.source, "; ".join(halted)
                )
                self._reset("board", None)
            self._configure_new(lp.package)
            failing.pop_all()
        for alias in self._cores:
            self.metrics.lifecycle.labels(alias, "configure").observe(time.monotonic() - t0)
        with contextlib.ExitStack() as failing:
            failing.push(lambda _type, exc, _tb: self._unconfigure_failed(lp, exc))
            gen = self._next_generation()
            self._set_all(ModelState.WARMING, admission=ModelState.WARMING)
            self._golden_and_warmup(lp.package, list(self._cores), gen)
            failing.pop_all()
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
        with contextlib.ExitStack() as failing:
            failing.callback(self._release_calbin)
            self.rt.configure(self._calbin)
            failing.pop_all()

    def _unconfigure_failed(self, lp: LoadedPackage, exc: BaseException | None) -> None:
        """Golden or warm-up of ``lp`` failed (or was interrupted): every alias Failed with the reason, the
        configuration dropped and its calbin released (000 §11 step 9: nothing is published)."""
        self._failed_load(f"golden/warmup failed ({lp.source}): {exc or type(exc).__name__}")
        with contextlib.suppress(RuntimeLayerError):
            self.rt.reset_configuration()
        self._release_calbin()

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

    def unload(self, alias: str | None = None) -> UnloadResult:
        """Unload the package (a combined package unloads as a whole, 001 §11.2)."""
        with self._lifecycle:
            if self.loaded is None:
                return UnloadResult(False, detail="nothing is loaded")
            drained = self._drain(self.options.drain_deadline_s)
            self._teardown("unload")
            for w in self._cores.values():
                w.detach()
            self.unloaded, self.loaded = self.loaded, None
            check = self.verify_device()  # 000 §12: "verify device memory/health" -> Unloaded
            out = UnloadResult(True, tuple(self._cores), drained, check)
            if not check.ok:
                detail = "unload left the device unclean: " + "; ".join(check.problems)
                if self.load_policy.fail_unclean_unload:
                    log.error(detail)
                    self._set_all(ModelState.FAILED, detail=detail)
                    return dataclasses.replace(out, ok=False, detail=detail)
                log.warning("%s (reported only)", detail)
                out = dataclasses.replace(out, detail=detail)
            self._set_all(ModelState.UNLOADED, detail="" if check.ok else "device check failed")
            return out

    def verify_device(self) -> DeviceCheck:
        """000 §12 after an unload (:func:`calctl.serving.engine.device_check.verify_device`)."""
        return verify_device(self.rt, self._idle_memory)

    def load(self, source: Path | None = None) -> LoadResult:
        """Load a package while nothing is loaded, through the 11 steps of 000 §11 (golden + warm-up before
        publish). ``source`` None: the package the last unload took down, else the start-up package. When the
        new package fails after configure, the one the unload took down is configured again in the same call
        (000 §11 step 11) and the response says so."""
        with self._lifecycle:
            if self.loaded is not None:
                return LoadResult(False, "a package is loaded; use reload")
            fallback = self.unloaded
            target = Path(source) if source is not None else (fallback.source if fallback else self.startup_source)
            if target is None:
                return LoadResult(False, "nothing to load: name a package")
            lp = None
            try:
                lp = resolve_package(target)  # step 1
                self._set_all(ModelState.VALIDATING, detail=str(lp.source))  # 001 §11.1: shown while checked
                self._check(lp)  # steps 2-4 (and 8's static half)
                check_compatible(lp, {a: c.model for a, c in self._cores.items()})
            except CalctlError as exc:
                self._discard(lp)
                self._set_all(ModelState.UNLOADED, detail=f"load refused: {exc}")
                return LoadResult(False, str(exc), NOTHING_SERVED)
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
                return LoadResult(False, str(exc), ROLLED_BACK, digest=fallback.digest)
            dropped = None
            if fallback is not None and fallback.root != lp.root:
                dropped, self.previous = self.previous, fallback  # step 11: the unloaded one is the rollback
            self.unloaded = None
            self._discard(dropped)
            if fallback is not None and fallback is not self.previous:
                self._discard(fallback)
            return LoadResult(True, generation=self._generation, digest=lp.digest)

    def rollback(self) -> RollbackResult:
        """One call back to the retained previous package (000 §11 step 11): the reload (or, after an unload,
        the load) steps with it, golden + warm-up before publish. The package rolled back from is retained."""
        prev = self.previous
        if prev is None:
            return RollbackResult(None, refusal="no previous package is retained")
        via = self.load(prev.source) if self.loaded is None else self.reload(prev.source)
        return RollbackResult(via, str(prev.source))

    def resolve_admin_package(self, package: str) -> Path:
        """The path an admin load or reload names, if this server may load it
        (:func:`calctl.serving.engine.packages.admin_package_path`): under a ``--package-root``, or a package
        this server served (start-up, current, previous, unloaded)."""
        served = [self.startup_source] + [x.source for x in (self.loaded, self.previous, self.unloaded) if x]
        return admin_package_path(package, served, self.load_policy.package_roots)

    def reload(self, source: Path | None = None) -> ReloadResult:
        """Replace the served package. A failed check keeps the old generation serving (000 §11)."""
        current = self.loaded
        target = Path(source) if source else (current.source if current else None)
        if target is None:
            return ReloadResult(False, "nothing to reload")
        lp = None
        try:
            lp = resolve_package(target)
            self._check(lp)  # steps 2–4 outside the lock: the old generation keeps serving meanwhile
            check_compatible(lp, {a: c.model for a, c in self._cores.items()})
        except CalctlError as exc:
            self._discard(lp)
            return ReloadResult(False, str(exc), PREVIOUS_GENERATION)
        with self._lifecycle:
            if self.loaded is not current:
                self._discard(lp)
                # A load, unload or reload ran while this one was checked: going on would undo it, and roll
                # back (on failure) to a package that is no longer the served one.
                return ReloadResult(
                    False,
                    "the served package changed while this reload was checked (a concurrent load, "
                    "unload or reload); nothing was changed by this call, retry it if it is still wanted",
                )
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
                    return ReloadResult(False, str(exc), ROLLED_BACK)
            finally:
                for w in self._cores.values():
                    w.set_rejecting(False)
            return ReloadResult(True, generation=self._generation, digest=lp.digest)

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


__all__ = ["DeviceSupervisor"]
