"""RequestRegistry against a plain-dict reference model (000 §4, §17.2).

Random create / queue / admit / start-job / completion (accepted and stale) /
cancel / deadline / fault sequences. After every step: the live states equal
the model, the terminal hook fired exactly once per finished request (never
twice, never for a live one), cancel answers match 000 §4 rule 2, and stale
callbacks changed nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from calctl.serving.core import (
    CallbackDisposition,
    CancelOutcome,
    EndReason,
    JobId,
    ModelGenerationId,
    RequestId,
    RequestRegistry,
    RequestState,
    SequenceState,
    TenantId,
)

S = RequestState
G = ModelGenerationId(1)
READY = {S.PREFILL_READY, S.DECODE_READY}
RUNNING = {S.PREFILL_RUNNING, S.DECODE_RUNNING}
WAITING = {S.NEW, S.WAITING_MODEL, S.WAITING_ADMISSION}


class RegistryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.terminal: Counter[str] = Counter()
        self.reg = RequestRegistry(lambda seq, ev, prev: self._on_terminal(ev, prev), remember_terminal=10_000)
        self.model: dict[str, dict[str, Any]] = {}
        self.n = 0
        self.job = 0
        self.now = 0.0

    def _on_terminal(self, ev: Any, prev: S) -> None:
        self.terminal[ev.request_id] += 1
        assert self.model[ev.request_id]["state"] == prev

    def _ids(self, states: set[S]) -> list[str]:
        return sorted(r for r, m in self.model.items() if m["state"] in states)

    def _seq(self, rid: str) -> SequenceState:
        """The registry's record of a request the model knows is live."""
        seq = self.reg.get(RequestId(rid))
        assert seq is not None, rid
        return seq

    def _finish(self, rid: str, state: S, reason: EndReason) -> None:
        seq = self._seq(rid)
        assert self.reg.finish(seq, state, reason, self.now)
        self.model[rid].update(state=state, job=None)
        assert not self.reg.finish(seq, S.FAILED, EndReason.INTERNAL, self.now)  # entered once

    @rule()
    def create(self) -> None:
        rid = f"r{self.n}"
        self.n += 1
        self.reg.create(RequestId(rid), TenantId("t"), self.now)
        self.model[rid] = {"state": S.NEW, "flag": False, "job": None}

    @precondition(lambda self: self._ids({S.NEW, S.WAITING_ADMISSION}))
    @rule(data=st.data(), admit=st.booleans())
    def admission(self, data: st.DataObject, admit: bool) -> None:
        rid = data.draw(st.sampled_from(self._ids({S.NEW, S.WAITING_ADMISSION})))
        seq = self._seq(rid)
        to = S.PREFILL_READY if admit or self.model[rid]["state"] is S.WAITING_ADMISSION else S.WAITING_ADMISSION
        self.reg.move(seq, to, self.now)
        self.model[rid]["state"] = to

    @precondition(lambda self: self._ids(READY))
    @rule(data=st.data())
    def start_job(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._ids(READY)))
        self.job += 1
        self.reg.start_job(self._seq(rid), JobId(self.job), G, self.now)
        m = self.model[rid]
        m.update(state=S.PREFILL_RUNNING if m["state"] is S.PREFILL_READY else S.DECODE_RUNNING, job=self.job)

    @precondition(lambda self: self._ids(RUNNING))
    @rule(data=st.data(), finished=st.booleans())
    def complete(self, data: st.DataObject, finished: bool) -> None:
        rid = data.draw(st.sampled_from(self._ids(RUNNING)))
        m = self.model[rid]
        verdict = self.reg.check_callback(RequestId(rid), G, JobId(m["job"]))
        assert verdict is (CallbackDisposition.CANCEL_DRAINED if m["flag"] else CallbackDisposition.ACCEPT)
        seq = self._seq(rid)
        m["job"] = None
        if m["flag"]:
            self._finish(rid, S.CANCELLED, EndReason.CANCELLED)
        elif finished:
            self.reg.move(seq, S.FINISHING, self.now)
            m["state"] = S.FINISHING
            self._finish(rid, S.COMPLETED, EndReason.LENGTH)
        else:
            self.reg.move(seq, S.DECODE_READY, self.now)
            m["state"] = S.DECODE_READY

    @precondition(lambda self: self.model)
    @rule(data=st.data(), wrong=st.sampled_from(["job", "generation", "unknown"]))
    def stale_callback(self, data: st.DataObject, wrong: str) -> None:
        rid = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[rid]
        job = JobId((m["job"] or 0) + 1000) if wrong == "job" else JobId(m["job"] or 0)
        gen = ModelGenerationId(99) if wrong == "generation" else G
        target = RequestId("nobody") if wrong == "unknown" else RequestId(rid)
        before = dict(m)
        assert self.reg.check_callback(target, gen, job) is CallbackDisposition.STALE
        assert self.model[rid] == before

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([*sorted(self.model), "never-seen"]))
        got = self.reg.cancel(RequestId(rid), self.now)
        if rid == "never-seen":
            assert got is CancelOutcome.UNKNOWN
            return
        m = self.model[rid]
        st_ = m["state"]
        if st_.terminal:
            assert got is CancelOutcome.ALREADY_TERMINAL
        elif st_ in WAITING | READY:
            assert got is CancelOutcome.CANCELLED
            m["state"] = S.CANCELLED
        elif st_ in RUNNING:
            assert got is (CancelOutcome.ALREADY_REQUESTED if m["flag"] else CancelOutcome.FLAGGED)
            m["flag"] = True

    @precondition(lambda self: self._ids(WAITING | READY))
    @rule(data=st.data())
    def deadline(self, data: st.DataObject) -> None:
        """A deadline passes for a request no job holds: it fails at once."""
        rid = data.draw(st.sampled_from(self._ids(WAITING | READY)))
        self.now += 1.0
        self._finish(rid, S.FAILED, EndReason.DEADLINE)

    @precondition(lambda self: self._ids(RUNNING))
    @rule(data=st.data())
    def fault(self, data: st.DataObject) -> None:
        """Timeout / fault: the job is retired; the request fails; the late completion is stale."""
        rid = data.draw(st.sampled_from(self._ids(RUNNING)))
        seq = self._seq(rid)
        job = self.model[rid]["job"]
        assert self.reg.detach_job(seq) == job
        self._finish(rid, S.FAILED, EndReason.DEVICE_ERROR)
        assert self.reg.check_callback(RequestId(rid), G, JobId(job)) is CallbackDisposition.STALE

    @invariant()
    def agrees_with_model(self) -> None:
        live = {r for r, m in self.model.items() if not m["state"].terminal}
        assert {s.request_id for s in self.reg} == live
        for seq in self.reg:
            m = self.model[seq.request_id]
            assert seq.state is m["state"] and seq.cancel_requested == m["flag"] and seq.current_job == m["job"]
        for rid, m in self.model.items():
            assert self.terminal[rid] == (1 if m["state"].terminal else 0), rid
            if m["state"].terminal:
                assert self.reg.final_state(RequestId(rid)) is m["state"]
        assert self.reg.terminal_events == sum(self.terminal.values())


RegistryMachine.TestCase.settings = settings(
    max_examples=75, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRegistryMachine = RegistryMachine.TestCase
