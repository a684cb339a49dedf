"""The recovery half of the DeviceSupervisor (001 §11.3): an engine core reports a timeout or a fault, and
the aliases the reset touches are drained, reset, re-verified and republished, or Failed with the reason.

:class:`BoardRecovery` is a base of :class:`calctl.serving.engine.supervisor.DeviceSupervisor`: it owns
the recovery thread, the reset budget and the recovery records; the supervisor owns the state they act on
(the engine cores, the lifecycle lock, the served package) and the configure step. A recovery is one
:class:`_Attempt` walked through :meth:`BoardRecovery.recover`'s steps: plan the scope, drain, keep the
evidence, check the budget, reset, then golden + warm-up alias by alias. The values it records and the
evidence document are in :mod:`calctl.serving.engine.recovery`; no lifecycle call (load, unload, reload)
is here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calctl.errors import CalctlError
from calctl.package.model import Package
from calctl.runtime.errors import DeviceLost, NotSupported, RuntimeLayerError, RuntimeStatus
from calctl.serving.core.admission import ModelState
from calctl.serving.engine.bounded_log import BoundedLog
from calctl.serving.engine.gate import verify_each
from calctl.serving.engine.loop import EngineCore, RecoveryRequest
from calctl.serving.engine.recovery import (
    RecoveryPolicy,
    RecoveryQueue,
    RecoveryRecord,
    effective_policy,
    evidence_document,
    status_name,
    write_evidence,
)

if TYPE_CHECKING:
    from calctl.runtime.interface import Runtime
    from calctl.serving.config import DualModelConfig, SchedulerConfig
    from calctl.serving.engine.metrics import EngineMetrics
    from calctl.serving.engine.options import LoadedPackage, SupervisorOptions

log = logging.getLogger("calctl.serve")

#: 000 §15 ``max_resets_per_10min``: the window the reset budget counts in.
RESET_WINDOW_S = 600


@dataclass
class _Attempt:
    """One recovery under way: what the core asked for, the scope wanted, every alias it touches so far
    (a refused chip reset widens it to every alias) and its evidence file once written."""

    req: RecoveryRequest
    t0: float
    policy: RecoveryPolicy
    package: Package
    chips: tuple[int, ...]  # the faulted alias's chips
    want: str  # the reset scope asked for: chip or board
    affected: list[str]
    evidence: Path | None = None

    @property
    def unknown_dma(self) -> bool:
        return self.req.runtime_status is RuntimeStatus.UNKNOWN_DMA_STATE


class BoardRecovery:
    """Recoveries, one at a time on the supervisor's recovery thread (001 §11.3; the module docstring)."""

    if TYPE_CHECKING:  # the state and the lifecycle steps the DeviceSupervisor holds
        rt: Runtime
        options: SupervisorOptions
        metrics: EngineMetrics
        dual_config: DualModelConfig | None
        scheduler_configs: dict[str, SchedulerConfig]
        loaded: LoadedPackage | None
        failures: dict[str, str]
        recoveries: BoundedLog[RecoveryRecord]
        _cores: dict[str, EngineCore]
        _lifecycle: threading.Lock
        _closed: bool

        def _event(self, alias: str, state: ModelState | str, detail: str = "") -> None: ...
        def _next_generation(self) -> int: ...
        def _configure_new(self, pkg: Package) -> None: ...

    def __init__(self) -> None:
        """Called last by the supervisor's ``__init__``: the thread may run a recovery once its state exists."""
        self.evidence: list[dict[str, Any]] = []  # the last recoveries' evidence documents
        self._resets: deque[float] = deque()
        self._recovery_queue = RecoveryQueue()  # handled one at a time by the thread below
        self._recovery_thread = threading.Thread(target=self._recovery_loop, name="supervisor-recovery", daemon=True)
        self._recovery_thread.start()

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

    def policy(self, alias: str) -> RecoveryPolicy:
        """The effective ``recovery`` block for ``alias`` (:func:`calctl.serving.engine.recovery.effective_policy`)."""
        sched = self.scheduler_configs.get(alias)
        if sched is None and self.dual_config is not None:
            with contextlib.suppress(KeyError):
                sched = self.dual_config.model(alias).effective_scheduler()
        return effective_policy(self.options, sched, self.dual_config.recovery if self.dual_config else None)

    # ------------------------------------------------------------------ one recovery, step by step

    def recover(self, req: RecoveryRequest) -> RecoveryRecord:
        t0 = time.monotonic()
        t0_ns = time.monotonic_ns()
        with self._lifecycle:
            skipped = self._needless(req, t0)
            if skipped is not None:
                return skipped
            at = self._plan(req, t0)
            self._stop_and_drain(at.affected, f"{req.status.value}: {req.detail}", req.alias)
            at.evidence = self._save_evidence(req, at.want, at.affected, t0_ns)
            refused = self._refused(at)
            if refused is not None:
                return refused
            scope = self._reset_attempt(at)
            if isinstance(scope, RecoveryRecord):
                return scope
            return self._republish(at, scope)

    def _needless(self, req: RecoveryRequest, t0: float) -> RecoveryRecord | None:
        """The record of a recovery with nothing to do: nothing is served, or the faulted generation is gone."""
        if self._closed or self.loaded is None:
            return RecoveryRecord(req.alias, req.status.value, None, "none", (), False, 0.0, t0, "not serving")
        core = self._cores[req.alias]
        if req.generation is None or core.generation == req.generation or not core.is_ready():
            return None
        # The fault was in a generation a later recovery (or reload) already replaced: a board-wide hang times
        # out A's and B's jobs alike, and A's board reset already reset and republished B. Resetting again
        # would cost a second reset of the budget for one fault.
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

    def _plan(self, req: RecoveryRequest, t0: float) -> _Attempt:
        """The scope wanted and the aliases it touches (001 §11.2, §11.3)."""
        assert self.loaded is not None  # _needless returned a record otherwise
        pol = self.policy(req.alias)
        core = self._cores[req.alias]
        # 001 §11.3: until fault injection proves otherwise every timeout/crash may have touched the whole
        # board. Chip scope only when the configuration allows a session reset (and the runtime grants it).
        want = "chip" if pol.allow_session_reset and len(core.chips) == 1 else "board"
        if req.runtime_status is RuntimeStatus.UNKNOWN_DMA_STATE and pol.restart_on_unknown_dma:
            want = "board"  # 000 §15 restart_on_unknown_dma
        # Every alias the reset touches: a chip reset touches each alias with a model on that chip (001 §11.2).
        affected = [
            a for a, w in self._cores.items() if a == req.alias or want == "board" or set(w.chips) & set(core.chips)
        ]
        return _Attempt(req, t0, pol, self.loaded.package, tuple(core.chips), want, affected)

    def _refused(self, at: _Attempt) -> RecoveryRecord | None:
        """No reset for this attempt: the configuration asks for a process restart on an unknown DMA state
        (000 §15), or the reset budget is spent (``max_resets_per_10min``). Else the reset is counted."""
        if at.unknown_dma and at.policy.restart_process_on_unknown_dma:
            reason = "unknown DMA state: restart the serving process (recovery.restart_process_on_unknown_dma)"
            self._fail(list(self._cores), reason)
            at.affected = list(self._cores)
            return self._record(at, "process", False, reason)
        now = time.monotonic()
        while self._resets and now - self._resets[0] > RESET_WINDOW_S:
            self._resets.popleft()
        limit = at.policy.max_resets_per_10min
        if len(self._resets) >= limit:
            reason = (
                f"reset budget exhausted: {len(self._resets)} reset(s) in 10 minutes, "
                f"recovery.max_resets_per_10min is {limit}"
            )
            self._fail(at.affected, reason)
            return self._record(at, "none", False, reason)
        self._resets.append(now)
        return None

    def _reset_attempt(self, at: _Attempt) -> str | RecoveryRecord:
        """The reset: the scope it ended as, or the record of a recovery whose board reset failed too."""
        tried: list[str] = []
        try:
            return self._reset_for(at.req, at.want, at.chips[0] if at.want == "chip" else None, at.affected, tried)
        except RuntimeLayerError as exc:
            # 001 §11.3 row 6: a failed reset takes both aliases out of service; device-level recovery.
            first = f"{tried[-1]} reset failed: {exc}"
            log.error("recovery of %s: %s; device-level recovery", at.req.alias, first)
            self._widen(at.affected, first)
            try:
                self._board_reset(at.req.alias)
            except RuntimeLayerError as exc2:
                reason = f"{first}; device-level board reset failed too: {exc2}"
                self._fail(at.affected, reason)
                return self._record(at, "device", False, reason)
            return "board"

    def _republish(self, at: _Attempt, scope: str) -> RecoveryRecord:
        """After the reset: configure again (a board reset dropped it), then golden + warm-up alias by alias
        (001 §13.3, :func:`calctl.serving.engine.gate.verify_each`); each alias whose own golden passed is Ready,
        the others Failed, alone."""
        for a in at.affected:
            self._cores[a].forget_device_state()
        try:
            gen = self._next_generation()
            if scope == "board":
                self._configure_new(at.package)  # the reset dropped (and aborted) the old one
            for a in at.affected:
                self._cores[a].set_state(ModelState.WARMING, admission=ModelState.RECOVERING)
                self._event(a, ModelState.WARMING, f"golden + warm-up after a {scope} reset")
            wrong = verify_each(self.rt, at.package, at.affected, gen, self.options, self.metrics)
            for a in at.affected:
                if a in wrong:
                    continue
                self.failures.pop(a, None)
                self._cores[a].publish(self.rt, gen)
                self._event(a, ModelState.READY, f"recovered, generation {gen}")
        except CalctlError as exc:
            reason = f"recovery after a {scope} reset failed: {exc}"
            self._fail(at.affected, reason)
            return self._record(at, scope, False, reason)
        if wrong:
            reason = f"recovery after a {scope} reset failed for {', '.join(wrong)}: {'; '.join(wrong.values())}"
            self._fail(list(wrong), reason)
            return self._record(at, scope, False, reason)
        return self._record(at, scope, True, "")

    def _record(self, at: _Attempt, scope: str, ok: bool, detail: str) -> RecoveryRecord:
        """The attempt's record and metrics (000 §16 recovery time: fault reported to recovery finished)."""
        took = time.monotonic() - at.t0
        for a in at.affected:
            self.metrics.recoveries.labels(a, at.req.status.value, scope).inc()
            self.metrics.recovery_time.labels(a, scope, "ok" if ok else "failed").observe(took)
        rec = RecoveryRecord(
            at.req.alias,
            at.req.status.value,
            status_name(at.req.runtime_status),
            scope,
            tuple(at.affected),
            ok,
            took,
            at.t0,
            detail,
            str(at.evidence) if at.evidence else None,
            {a: self._cores[a].generation for a in self._cores},
        )
        self.recoveries.append(rec)
        return rec

    # ------------------------------------------------------------------ the steps' parts

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

    def isolation_evidence(self) -> list[dict[str, Any]]:
        """Every recovery record as JSON (``/internal/status`` "recoveries", the bench's evidence)."""
        return [dataclasses.asdict(r) for r in self.recoveries]


__all__ = ["RESET_WINDOW_S", "BoardRecovery"]
