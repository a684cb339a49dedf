"""The whole Scheduler under random traffic, faults and deadlines (000 §4, §9.2, §17.2–§17.3 in a pure setting).

Random arrivals (tenants, prompt sizes, deadlines), cancels, scheduling,
completions in any order with OK / FAILED / TIMEOUT / FAULT, late (stale)
completions, delayed KV release confirmations, clock jumps, and device
reset + recovery. After every step the cross-component invariants hold; every
request gets at most one terminal event; once nothing is live and nothing is
in flight every resource is back (no leaked lane, slot or token).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from calctl.serving.core import (
    AdmissionPolicy,
    BatchProfile,
    CapacityBudget,
    DecodeOptions,
    InactiveLaneContract,
    JobOutcome,
    JobStatus,
    KvState,
    LaneReleased,
    LaneResult,
    ModelGenerationId,
    PrefillJob,
    RecoveryNeeded,
    RequestId,
    Scheduler,
    SchedulerSettings,
    TenantId,
    TenantPolicy,
    TerminalEvent,
    Ticket,
)
from calctl.serving.core.prefill import PrefillThresholds
from calctl.serving.outcomes import http_status_of_decision


def _settings() -> SchedulerSettings:
    return SchedulerSettings(
        budget=CapacityBudget(4, 200, 6, 400, 2),
        max_seq=128,
        admission=AdmissionPolicy(
            context_limit=128,
            deadline_default_s=5.0,
            tenants={
                TenantId("a"): TenantPolicy(weight=1.0, max_active_sequences=2),
                TenantId("b"): TenantPolicy(weight=3.0),
            },
        ),
        prefill_graph="p",
        profiles=(BatchProfile("d", 1, 128), BatchProfile("d", 4, 128, InactiveLaneContract("valid"))),
        prefill_thresholds=PrefillThresholds(16, 64),
        decode=DecodeOptions(batching_window_s=0.01, max_tenant_lane_share=0.5),
    )


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.gen = 1
        self.sched = Scheduler(_settings(), generation=ModelGenerationId(1))
        self.now = 0.0
        self.n = 0
        self.tickets: list[tuple[Ticket, int, int, float | None]] = []  # arrived, prompt not yet counted
        self.out: list[Any] = []  # jobs handed out, not yet completed
        self.late: list[Any] = []  # timed-out jobs whose completion may still arrive
        self.releasing: list[Any] = []
        self.terminal: Counter[str] = Counter()
        self.known: set[str] = set()
        self.needs_recovery = False

    def _pump(self, events: list[Any] | None = None) -> None:
        for ev in [*(events or ()), *self.sched.drain_events()]:
            if isinstance(ev, TerminalEvent):
                self.terminal[ev.request_id] += 1
                assert self.terminal[ev.request_id] == 1, f"second terminal event for {ev.request_id}"
            elif isinstance(ev, LaneReleased):
                self.releasing.append(ev.lane)
            elif isinstance(ev, RecoveryNeeded):
                self.needs_recovery = True

    @rule(
        tenant=st.sampled_from(["a", "b", "c"]),
        prompt=st.integers(0, 100),
        out=st.integers(0, 40),
        deadline=st.one_of(st.none(), st.floats(0.001, 10.0)),
        counted=st.booleans(),
    )
    def arrive(self, tenant: str, prompt: int, out: int, deadline: float | None, counted: bool) -> None:
        rid = f"r{self.n}"
        self.n += 1
        self.known.add(rid)
        t = self.sched.arrive(RequestId(rid), TenantId(tenant), self.now)
        if not isinstance(t, Ticket):
            assert http_status_of_decision(t.decision) in (429, 503)
            return
        if counted:
            self.sched.submit(t, prompt_tokens=prompt, max_tokens=out, deadline_s=deadline, now=self.now)
        else:
            self.tickets.append((t, prompt, out, deadline))
        self._pump()

    @precondition(lambda self: self.tickets)
    @rule(data=st.data(), abandon=st.booleans())
    def count_prompt(self, data: st.DataObject, abandon: bool) -> None:
        """The tokenizer finished (or failed) for a request that arrived earlier."""
        t, prompt, out, deadline = self.tickets.pop(data.draw(st.integers(0, len(self.tickets) - 1)))
        if abandon:
            self.sched.abandon(t.request_id, self.now, detail="tokenizer failed")
        else:
            self.sched.submit(t, prompt_tokens=prompt, max_tokens=out, deadline_s=deadline, now=self.now)
        self._pump()

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.sched.cancel(RequestId(data.draw(st.sampled_from(sorted(self.known)))), self.now)
        self._pump()

    @rule()
    def schedule(self) -> None:
        out = self.sched.schedule(self.now)
        if self.needs_recovery:
            assert out.jobs == ()
        self.out.extend(out.jobs)
        self._pump()

    @precondition(lambda self: self.out)
    @rule(
        data=st.data(),
        status=st.sampled_from([JobStatus.OK] * 6 + [JobStatus.FAILED, JobStatus.TIMEOUT, JobStatus.FAULT]),
        stop=st.booleans(),
    )
    def complete(self, data: st.DataObject, status: JobStatus, stop: bool) -> None:
        job = self.out.pop(data.draw(st.integers(0, len(self.out) - 1)))  # completions in any order
        rids = [job.request_id] if isinstance(job, PrefillJob) else [lane.request_id for lane in job.batch.lanes]
        results = (
            tuple(LaneResult(r, 7, stop=stop and i == 0) for i, r in enumerate(rids)) if status is JobStatus.OK else ()
        )
        evs = self.sched.update_from_output(
            JobOutcome(job.job_id, job.generation, status, results, "injected"), self.now
        )
        if status is JobStatus.TIMEOUT:
            self.late.append((job, rids))
        self._pump(evs)

    @precondition(lambda self: self.late)
    @rule()
    def late_completion(self) -> None:
        """A timed-out job completes after all: dropped as stale, never delivered."""
        job, rids = self.late.pop()
        before = dict(self.terminal)
        evs = self.sched.update_from_output(
            JobOutcome(job.job_id, job.generation, JobStatus.OK, tuple(LaneResult(r, 1) for r in rids)), self.now
        )
        assert [type(e).__name__ for e in evs] == ["StaleCompletion"]
        assert dict(self.terminal) == before

    @precondition(lambda self: self.releasing)
    @rule()
    def confirm_release(self) -> None:
        lane = self.releasing.pop(0)
        if self.sched.kv.state(lane) is KvState.RELEASING:  # a reset may have made it Unknown meanwhile
            self.sched.confirm_kv_released(lane)

    @rule(dt=st.sampled_from([0.001, 0.01, 0.5, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self.needs_recovery)
    @rule()
    def reset_and_recover(self) -> None:
        """Device reset: in-flight jobs are quarantined, device-holding requests fail, lanes recover."""
        self.sched.retire_generation(self.now, "reset")
        self._pump()
        self.late.extend((j, []) for j in self.out)
        self.out.clear()
        self.releasing.clear()
        self.gen += 1
        self.sched.recover(ModelGenerationId(self.gen), self.now)
        self.needs_recovery = False
        self._pump()

    @invariant()
    def consistent(self) -> None:
        self.sched.check_invariants()
        for rid, count in self.terminal.items():
            assert count == 1 and self.sched.registry.get(RequestId(rid)) is None
        if len(self.sched.registry) == 0 and self.sched.inflight_jobs == 0:
            stats = self.sched.admission.stats()
            assert (stats.waiting_requests, stats.waiting_prompt_tokens, stats.admitted) == (0, 0, 0)
            kv = self.sched.kv.stats().by_state
            assert kv.get(KvState.RESERVED, 0) == kv.get(KvState.ACTIVE, 0) == kv.get(KvState.UPDATING, 0) == 0


SchedulerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestSchedulerMachine = SchedulerMachine.TestCase
