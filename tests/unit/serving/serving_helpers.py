"""Factories for the serving-core tests (imported as ``serving_helpers``): settings, schedulers, a fake clock and a fake device.

Nothing here sleeps: time is a number the test advances (000 §17.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from calctl.serving.core import (
    AdmissionPolicy,
    BatchProfile,
    CapacityBudget,
    DecodeJob,
    DecodeOptions,
    InactiveLaneContract,
    JobOutcome,
    JobStatus,
    LaneReleased,
    LaneResult,
    ModelGenerationId,
    PrefillJob,
    RequestId,
    Scheduler,
    SchedulerSettings,
    TenantId,
    Ticket,
)

B1 = BatchProfile("m_decode", 1, 16384)


def bprofile(b: int, **contract: Any) -> BatchProfile:
    return BatchProfile("m_decode", b, 16384, InactiveLaneContract("lane_valid", **contract))


@dataclass
class FakeClock:
    """A monotonic clock the test moves by hand."""

    now: float = 0.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def make_settings(
    *,
    max_sequences: int = 8,
    max_kv_tokens: int = 65536,
    max_waiting_requests: int = 64,
    max_waiting_prompt_tokens: int = 1_000_000,
    max_inflight_jobs: int = 1,
    context_limit: int = 4096,
    deadline_default_s: float = 120.0,
    profiles: tuple[BatchProfile, ...] = (B1,),
    decode: DecodeOptions = DecodeOptions(),
    **admission: Any,
) -> SchedulerSettings:
    return SchedulerSettings(
        budget=CapacityBudget(
            max_sequences, max_kv_tokens, max_waiting_requests, max_waiting_prompt_tokens, max_inflight_jobs
        ),
        max_seq=context_limit,
        admission=AdmissionPolicy(context_limit=context_limit, deadline_default_s=deadline_default_s, **admission),
        prefill_graph="m_prefill",
        profiles=profiles,
        decode=decode,
    )


@dataclass
class FakeDevice:
    """Completes every job the scheduler hands out, with a scripted token per request."""

    sched: Scheduler
    clock: FakeClock
    stop_after: dict[str, int] = field(default_factory=dict)  # request -> emit stop on this output index
    events: list[Any] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)
    _returned: list[Any] = field(default_factory=list)  # update_from_output's events, for the next pump()

    def add(
        self, rid: str, tenant: str = "t", *, prompt: int = 10, max_tokens: int = 4, deadline_s: float | None = None
    ):
        ticket = self.sched.arrive(RequestId(rid), TenantId(tenant), self.clock.now)
        assert isinstance(ticket, Ticket), ticket
        return self.sched.submit(
            ticket, prompt_tokens=prompt, max_tokens=max_tokens, deadline_s=deadline_s, now=self.clock.now
        )

    def outcome(self, job: Any, status: JobStatus = JobStatus.OK) -> JobOutcome:
        if status is not JobStatus.OK:
            return JobOutcome(job.job_id, job.generation, status, detail="injected")
        rids = [job.request_id] if isinstance(job, PrefillJob) else [lane.request_id for lane in job.batch.lanes]
        results = []
        for rid in rids:
            seq = self.sched.registry.get(rid)
            index = seq.generated_tokens if seq else 0
            results.append(LaneResult(rid, 100 + index, stop=self.stop_after.get(rid) == index))
        return JobOutcome(job.job_id, job.generation, JobStatus.OK, tuple(results))

    def step(self, dt: float = 0.001) -> list[Any]:
        """One engine iteration: schedule, complete every job, confirm KV releases."""
        out = self.sched.schedule(self.clock.now)
        self.sched.check_invariants()
        self.jobs.extend(out.jobs)
        for job in out.jobs:
            self.update(self.outcome(job), self.clock.now)
        self.pump()
        self.sched.check_invariants()
        self.clock.advance(dt)
        return list(out.jobs)

    def update(self, outcome: JobOutcome, now: float) -> list[Any]:
        """``update_from_output``: the step's events it returns wait for the next :meth:`pump`, in order."""
        evs = self.sched.update_from_output(outcome, now)
        self._returned.extend(evs)
        return evs

    def pump(self) -> list[Any]:
        evs, self._returned = [*self._returned, *self.sched.drain_events()], []
        for ev in evs:
            if isinstance(ev, LaneReleased) and self.sched.release_is_current(ev):  # as the engine loop does
                self.sched.confirm_kv_released(ev.lane)
        self.events.extend(evs)
        return evs

    def run(self, steps: int, dt: float = 0.001) -> None:
        for _ in range(steps):
            self.step(dt)


def make_device(clock: FakeClock, **settings: Any) -> FakeDevice:
    return FakeDevice(Scheduler(make_settings(**settings), generation=ModelGenerationId(1)), clock)


__all__ = ["B1", "DecodeJob", "FakeClock", "FakeDevice", "bprofile", "make_device", "make_settings", "replace"]
