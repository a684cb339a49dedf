"""Scheduler: the engine-facing core, driven with a fake clock and a fake device (000 §3–§9, 001 §9–§11)."""

from __future__ import annotations

from collections import Counter

import pytest

from calctl.serving.core import (
    AdmissionDecision,
    CancelOutcome,
    DecodeJob,
    DecodeOptions,
    EndReason,
    InvariantViolation,
    JobId,
    JobOutcome,
    JobStatus,
    KvState,
    LaneReleased,
    LaneResult,
    ModelGenerationId,
    ModelState,
    PrefillJob,
    RecoveryNeeded,
    RequestId,
    RequestState,
    StaleCompletion,
    TenantId,
    TerminalEvent,
    Ticket,
    TokenEmitted,
    WorkKind,
)
from calctl.serving.outcomes import http_status_of_decision, http_status_of_end
from tests.unit.serving.serving_helpers import B1, FakeClock, FakeDevice, bprofile, make_device

S = RequestState


def _prefill(job: PrefillJob | DecodeJob) -> PrefillJob:
    assert isinstance(job, PrefillJob), job
    return job


def _decode(job: PrefillJob | DecodeJob) -> DecodeJob:
    assert isinstance(job, DecodeJob), job
    return job


def _state(dev: FakeDevice, rid: str) -> RequestState | None:
    """Where the scheduler's registry has request ``rid`` (None: it holds no such request)."""
    seq = dev.sched.registry.get(RequestId(rid))
    return None if seq is None else seq.state


def _end_status(ev: TerminalEvent) -> int | None:
    return http_status_of_end(ev.reason, ev.generated_tokens)


def _terminals(events) -> dict[str, TerminalEvent]:
    out: dict[str, TerminalEvent] = {}
    for e in events:
        if isinstance(e, TerminalEvent):
            assert e.request_id not in out, f"second terminal event for {e.request_id}"
            out[e.request_id] = e
    return out


def test_request_lifecycle_prefill_decode_complete(clock: FakeClock) -> None:
    """001 §9.1: PrefillReady -> PrefillRunning -> DecodeReady -> DecodeRunning ... -> Completed, KV committed per step."""
    dev = make_device(clock)
    assert dev.add("r", prompt=10, max_tokens=3).decision is AdmissionDecision.ADMIT
    first = dev.step()
    assert isinstance(first[0], PrefillJob) and first[0].prompt_tokens == 10 and first[0].graph == "m_prefill"
    lane = first[0].kv_lane
    assert dev.sched.kv.committed_len(lane) == 10
    second = dev.step()
    assert (
        isinstance(second[0], DecodeJob) and second[0].batch.positions == (10,) and second[0].batch.token_ids == (100,)
    )
    dev.run(3)
    tokens = [e for e in dev.events if isinstance(e, TokenEmitted)]
    assert [(t.index, t.token_id) for t in tokens] == [(0, 100), (1, 101), (2, 102)]
    term = _terminals(dev.events)["r"]
    assert term.state is S.COMPLETED and term.reason is EndReason.LENGTH and term.generated_tokens == 3
    assert any(isinstance(e, LaneReleased) for e in dev.events)
    assert dev.sched.kv.state(lane) is KvState.FREE


def test_stop_token_finishes_early_and_credits_fairness(clock: FakeClock) -> None:
    """000 §5.3 credit-back: a request that stops early is charged only what it was served."""
    dev = make_device(clock)
    dev.stop_after["r"] = 1
    dev.add("r", tenant="x", prompt=10, max_tokens=50)
    dev.run(5)
    term = _terminals(dev.events)["r"]
    assert term.reason is EndReason.STOP and term.generated_tokens == 2
    assert dev.sched.admission.fairness.served_cost(TenantId("x")) == 10 + 2


def test_cancel_ready_is_immediate_and_frees_the_lane(clock: FakeClock) -> None:
    """000 §4 rule 2: cancel in DecodeReady completes at once; the lane is released; cancel is idempotent."""
    dev = make_device(clock)
    dev.add("r", max_tokens=10)
    dev.run(2)
    seq = dev.sched.registry.get(RequestId("r"))
    assert seq is not None and seq.state is S.DECODE_READY
    assert dev.sched.cancel(RequestId("r"), clock.now) is CancelOutcome.CANCELLED
    assert dev.sched.cancel(RequestId("r"), clock.now) is CancelOutcome.ALREADY_TERMINAL
    dev.pump()
    assert _terminals(dev.events)["r"].state is S.CANCELLED
    assert dev.sched.decode.ready_count == 0 and dev.sched.kv.free_lanes == 8
    dev.sched.check_invariants()


def test_cancel_while_running_drains_then_reclaims(clock: FakeClock) -> None:
    """000 §4 rule 2, §18: running cancel only flags; the job drains, its lane result is dropped, then the lane is freed."""
    dev = make_device(clock)
    dev.add("r", max_tokens=10)
    out = dev.sched.schedule(clock.now)
    job = _prefill(out.jobs[0])
    assert dev.sched.cancel(RequestId("r"), clock.now) is CancelOutcome.FLAGGED
    assert dev.sched.cancel(RequestId("r"), clock.now) is CancelOutcome.ALREADY_REQUESTED
    assert dev.sched.kv.state(job.kv_lane) is KvState.UPDATING  # still owned by the device
    dev.sched.check_invariants()
    dev.update(dev.outcome(job), clock.now)
    evs = dev.pump()
    assert not any(isinstance(e, TokenEmitted) for e in evs)  # the lane's result is discarded
    assert _terminals(evs)["r"].state is S.CANCELLED
    assert dev.sched.kv.state(job.kv_lane) is KvState.FREE
    dev.sched.check_invariants()


def test_timeout_quarantines_lanes_and_drops_the_late_completion(clock: FakeClock) -> None:
    """000 §9.2 rule 6, §4 rule 4, 001 §11.3: timeout -> Unknown lanes, halt, stale completion dropped but reclaimed."""
    dev = make_device(clock)
    dev.add("victim", max_tokens=5)
    dev.add("bystander", max_tokens=5)
    out = dev.sched.schedule(clock.now)
    job = out.jobs[0]
    assert isinstance(job, PrefillJob) and job.request_id == "victim"
    dev.update(JobOutcome(job.job_id, job.generation, JobStatus.TIMEOUT, detail="Wait 5s"), clock.now)
    evs = dev.pump()
    term = _terminals(evs)["victim"]
    assert term.state is S.FAILED and term.reason is EndReason.DEVICE_ERROR and _end_status(term) == 503
    assert [type(e) for e in evs if isinstance(e, RecoveryNeeded)] == [RecoveryNeeded]
    assert dev.sched.kv.state(job.kv_lane) is KvState.UNKNOWN
    assert dev.sched.halted and dev.sched.schedule(clock.now).jobs == ()
    dev.sched.check_invariants()
    # The job finishes after all: its completion is stale and delivers nothing.
    dev.update(JobOutcome(job.job_id, job.generation, JobStatus.OK, (LaneResult(RequestId("victim"), 1),)), clock.now)
    evs = dev.pump()
    assert [type(e) for e in evs] == [StaleCompletion] and evs[0].lanes == (job.kv_lane,)
    assert dev.sched.stats().quarantined_jobs == 0
    # Device reset: everything holding device state fails, lanes are Unknown until recover().
    unknown = dev.sched.retire_generation(clock.now, "board reset")
    assert job.kv_lane not in unknown and len(unknown) == 1
    evs = dev.pump()
    assert _terminals(evs)["bystander"].reason is EndReason.GENERATION_RETIRED
    assert dev.sched.kv.stats().by_state[KvState.UNKNOWN] == 2  # never handed out before recover()
    assert dev.sched.kv.state(job.kv_lane) is KvState.UNKNOWN
    dev.sched.recover(ModelGenerationId(2), clock.now)
    assert dev.sched.kv.free_lanes == 8 and not dev.sched.halted
    assert dev.add("after", max_tokens=2).decision is AdmissionDecision.ADMIT
    dev.run(3)
    assert _terminals(dev.events)["after"].state is S.COMPLETED
    assert dev.jobs[-1].generation == 2


def test_a_release_announced_before_a_reset_is_void_after_it(clock: FakeClock) -> None:
    """000 §9.2 rules 2 and 6: a lane announced Releasing, then retired by a board reset before the release was
    delivered, stays Unknown (its runtime sequence went with the reset) until recover(); the late release is void."""
    dev = make_device(clock)
    dev.add("r", max_tokens=1)
    job = _prefill(dev.sched.schedule(clock.now).jobs[0])
    evs = dev.update(dev.outcome(job), clock.now)  # update returns the events; the engine delivers them later
    evs = [*evs, *dev.sched.drain_events()]
    released = [e for e in evs if isinstance(e, LaneReleased)]
    assert len(released) == 1 and dev.sched.release_is_current(released[0])
    dev.sched.retire_generation(clock.now, "board reset")  # the supervisor's reset arrives first
    assert dev.sched.kv.state(job.kv_lane) is KvState.UNKNOWN
    assert not dev.sched.release_is_current(released[0])
    with pytest.raises(InvariantViolation):
        dev.sched.confirm_kv_released(job.kv_lane)  # what the engine loop did before it asked
    dev.sched.check_invariants()
    dev.sched.recover(ModelGenerationId(2), clock.now)
    assert dev.sched.kv.free_lanes == 8
    assert not dev.sched.release_is_current(released[0])  # nor once the lane is Free again
    assert dev.add("after", max_tokens=2).decision is AdmissionDecision.ADMIT
    dev.run(3)
    assert _terminals(dev.events)["after"].state is S.COMPLETED


def test_clean_failure_rolls_back_instead_of_quarantining(clock: FakeClock) -> None:
    """001 §9.1: a job that failed cleanly rolls its KV back; the lane is released normally, not Unknown."""
    dev = make_device(clock)
    dev.add("r")
    job = _prefill(dev.sched.schedule(clock.now).jobs[0])
    dev.update(JobOutcome(job.job_id, job.generation, JobStatus.FAILED, detail="rejected"), clock.now)
    evs = dev.pump()
    assert _terminals(evs)["r"].reason is EndReason.DEVICE_ERROR
    assert dev.sched.kv.state(job.kv_lane) is KvState.FREE and not dev.sched.halted


def test_a_submitted_job_failing_without_a_fault_marks_its_kv_unknown(clock: FakeClock) -> None:
    """000 §7.4: out of memory / invalid argument after submit: what the job wrote is unknown, never rolled back;
    the lane stays quarantined (not handed out) until a recovery, and no reset is asked for (not a fault)."""
    dev = make_device(clock)
    dev.add("r")
    job = _prefill(dev.sched.schedule(clock.now).jobs[0])
    dev.update(
        JobOutcome(job.job_id, job.generation, JobStatus.FAILED, detail="OUT_OF_MEMORY", kv_unknown=True), clock.now
    )
    evs = dev.pump()
    assert _terminals(evs)["r"].reason is EndReason.DEVICE_ERROR
    assert dev.sched.kv.state(job.kv_lane) is KvState.UNKNOWN and not dev.sched.halted
    assert not any(isinstance(e, RecoveryNeeded) for e in evs)
    dev.sched.check_invariants()
    dev.sched.recover(ModelGenerationId(2), clock.now)
    assert dev.sched.kv.state(job.kv_lane) is KvState.FREE


def test_stale_or_unknown_job_and_generation_tags(clock: FakeClock) -> None:
    """000 §4 rule 4: an unknown job is dropped as stale; a known job with a wrong generation tag is a bug."""
    dev = make_device(clock)
    dev.add("r")
    job = dev.sched.schedule(clock.now).jobs[0]
    dev.update(JobOutcome(JobId(9999), job.generation, JobStatus.OK), clock.now)
    assert isinstance(dev.pump()[0], StaleCompletion)
    with pytest.raises(InvariantViolation):
        dev.update(JobOutcome(job.job_id, ModelGenerationId(7), JobStatus.OK), clock.now)
    with pytest.raises(InvariantViolation, match="do not match"):  # 000 §7.4 lane consistency
        dev.update(JobOutcome(job.job_id, job.generation, JobStatus.OK, (LaneResult(RequestId("zz"), 1),)), clock.now)


def test_deadline_expiry_frees_resources_without_running(clock: FakeClock) -> None:
    """000 §5/§7.2 rule 1: an admitted request whose deadline passes is failed and its lane freed."""
    dev = make_device(clock, max_inflight_jobs=1)
    dev.add("slow", max_tokens=100)
    dev.add("short-lived", max_tokens=5, deadline_s=0.5)
    out = dev.sched.schedule(clock.now)  # prefill of "slow" runs; "short-lived" waits
    clock.advance(1.0)
    dev.update(dev.outcome(out.jobs[0]), clock.now)
    dev.sched.schedule(clock.now)
    evs = dev.pump()
    term = _terminals(evs)["short-lived"]
    assert term.reason is EndReason.DEADLINE and term.generated_tokens == 0
    assert dev.sched.kv.free_lanes == 7
    dev.sched.check_invariants()


def test_deadline_passing_while_running_fails_at_drain(clock: FakeClock) -> None:
    """000 §4: the running job drains first; the request then fails with its deadline reason."""
    dev = make_device(clock)
    dev.add("r", max_tokens=10, deadline_s=0.5)
    job = dev.sched.schedule(clock.now).jobs[0]
    clock.advance(1.0)
    assert dev.sched.schedule(clock.now).jobs == ()  # max_inflight 1, and r is still running
    dev.update(dev.outcome(job), clock.now)
    assert _terminals(dev.pump())["r"].reason is EndReason.DEADLINE


def test_draining_rejects_new_and_withdraws_waiting_but_finishes_admitted(clock: FakeClock) -> None:
    """000 §12 / §5.2: Draining -> new arrivals 503, waiting requests withdrawn (503), admitted ones complete."""
    dev = make_device(clock, max_sequences=1)
    dev.add("admitted", max_tokens=3)
    assert dev.add("waiting").decision is AdmissionDecision.QUEUE
    dev.sched.set_model_state(ModelState.DRAINING, clock.now)
    r = dev.sched.arrive(RequestId("new"), TenantId("t"), clock.now)
    assert not isinstance(r, Ticket) and http_status_of_decision(r.decision) == 503
    evs = dev.pump()
    assert _end_status(_terminals(evs)["waiting"]) == 503
    dev.run(5)  # drain: the admitted request runs to completion
    assert _terminals(dev.events)["admitted"].state is S.COMPLETED
    assert len(dev.sched.registry) == 0


def test_waiting_model_until_ready(clock: FakeClock) -> None:
    """000 §2 WaitingModel: requests that arrive while the model warms up are admitted when it turns Ready."""
    dev = make_device(clock)
    dev.sched.set_model_state(ModelState.WARMING, clock.now)
    assert dev.add("early").decision is AdmissionDecision.QUEUE
    assert _state(dev, "early") is S.WAITING_MODEL
    assert dev.sched.schedule(clock.now).jobs == ()
    dev.sched.set_model_state(ModelState.READY, clock.now)
    dev.run(6)
    assert _terminals(dev.events)["early"].state is S.COMPLETED


def test_abandon_rolls_back_before_submit(clock: FakeClock) -> None:
    """000 §5: a failure between arrival and decision (tokenizer) releases the slot and ends the request once."""
    dev = make_device(clock, max_waiting_requests=1)
    ticket = dev.sched.arrive(RequestId("r"), TenantId("t"), clock.now)
    assert isinstance(ticket, Ticket)
    assert dev.sched.abandon(RequestId("r"), clock.now, detail="prompt is not valid UTF-8")
    assert not dev.sched.abandon(RequestId("r"), clock.now, detail="again")
    assert _end_status(_terminals(dev.pump())["r"]) == 400
    assert isinstance(dev.sched.arrive(RequestId("r2"), TenantId("t"), clock.now), Ticket)  # slot is free again


def test_long_prefill_is_served_under_continuous_decode_and_short_load(clock: FakeClock) -> None:
    """000 §17.1 / §6: a long prompt is not starved by a steady stream of decode and short prefills."""
    dev = make_device(clock, max_sequences=64, max_kv_tokens=1_000_000, context_limit=8192)
    dev.add("long", prompt=6000, max_tokens=2)
    for i in range(60):
        dev.add(f"s{i}", prompt=50, max_tokens=30)
    kinds: list[WorkKind | str] = []
    for _ in range(40):
        kinds.extend(job.queue if isinstance(job, PrefillJob) else "decode" for job in dev.step())
    assert "long" in _terminals(dev.events) or _state(dev, "long") is not S.PREFILL_READY
    first_long = next(i for i, k in enumerate(kinds) if getattr(k, "value", k) == "long")
    assert first_long < 15


def test_b4_profile_end_to_end_with_inactive_lanes(clock: FakeClock) -> None:
    """000 §7–§8: ready count picks B4; lanes bound in deadline order; positions equal committed lengths."""
    dev = make_device(clock, profiles=(B1, bprofile(4)), decode=DecodeOptions(max_tenant_lane_share=1.0))
    for i in range(3):
        dev.add(f"r{i}", prompt=10 + i, max_tokens=20)
    b4 = []
    for _ in range(40):
        for job in dev.step():
            if isinstance(job, DecodeJob) and job.batch.profile.compiled_batch == 4:
                b4.append(job.batch)
                for lane in job.batch.lanes:  # committed after the step: position + 1
                    assert (
                        lane.position + 1 == dev.sched.kv.committed_len(lane.kv_lane)
                        or dev.sched.kv.state(lane.kv_lane) is not KvState.ACTIVE
                    )
    assert b4 and b4[0].lane_valid == (True, True, True, False)
    assert [lane.request_id for lane in b4[0].lanes] == ["r0", "r1", "r2"]  # earliest deadline first
    assert Counter(e.state for e in _terminals(dev.events).values()) == {S.COMPLETED: 3}


def test_max_inflight_and_wake_for_batching_window(clock: FakeClock) -> None:
    """000 §15 executor.max_inflight and §7.2 rule 4: at most N jobs out; the window gives a wake-up time."""
    dev = make_device(
        clock,
        max_inflight_jobs=2,
        profiles=(bprofile(4),),
        decode=DecodeOptions(batching_window_s=0.01, step_estimate_s=0.001),
    )
    dev.add("a")
    dev.add("b")
    dev.add("c")
    out = dev.sched.schedule(clock.now)
    assert len(out.jobs) == 2
    for job in out.jobs:
        dev.update(dev.outcome(job), clock.now)
    out = dev.sched.schedule(clock.now)  # c's prefill; a and b are decode-ready but the B4 window holds
    assert [type(j) for j in out.jobs] == [PrefillJob]
    dev.update(dev.outcome(out.jobs[0]), clock.now)
    hold = dev.sched.schedule(clock.now + 0.001)
    assert hold.jobs == () and hold.wake_at == pytest.approx(clock.now + 0.01)
    assert hold.wake_at is not None
    fire = dev.sched.schedule(hold.wake_at)
    assert len(fire.jobs) == 1 and len(_decode(fire.jobs[0]).batch.lanes) == 3


def test_one_worker_overload_does_not_touch_another(clock: FakeClock) -> None:
    """001 §9.2: model A's 429 never blocks model B -- each worker has its own admission and KV."""
    a = make_device(clock, max_sequences=1, max_waiting_requests=1)
    b = make_device(clock)
    a.add("a0")
    a.add("a1")
    rej = a.sched.arrive(RequestId("a2"), TenantId("t"), clock.now)
    assert not isinstance(rej, Ticket) and http_status_of_decision(rej.decision) == 429
    assert b.add("b0").decision is AdmissionDecision.ADMIT


def test_a_stop_string_is_a_real_finish_reason_not_a_cancel(clock: FakeClock) -> None:
    """Issue 15 item 2: a stop string found in the text ends the request Completed/STOP, from DecodeReady at once."""
    dev = make_device(clock)
    dev.add("r", prompt=10, max_tokens=20)
    dev.run(3)  # prefill + two decode steps: DecodeReady between steps
    seq = dev.sched.registry.get(RequestId("r"))
    assert seq is not None and seq.state is S.DECODE_READY
    assert dev.sched.stop(RequestId("r"), clock.now) is CancelOutcome.CANCELLED
    term = _terminals(dev.pump())["r"]
    assert term.state is S.COMPLETED and term.reason is EndReason.STOP and term.detail == "stop string"
    assert _end_status(term) is None
    assert dev.sched.stop(RequestId("r"), clock.now) is CancelOutcome.ALREADY_TERMINAL
    dev.sched.check_invariants()


def test_a_stop_string_while_running_completes_when_the_job_drains(clock: FakeClock) -> None:
    """The job holding the request drains; its lane result is discarded, the request is Completed/STOP."""
    dev = make_device(clock)
    dev.add("r", prompt=10, max_tokens=20)
    dev.run(2)
    out = dev.sched.schedule(clock.now)
    (job,) = out.jobs
    assert dev.sched.stop(RequestId("r"), clock.now) is CancelOutcome.FLAGGED
    assert dev.sched.stop(RequestId("r"), clock.now) is CancelOutcome.ALREADY_REQUESTED
    dev.update(dev.outcome(job), clock.now)
    evs = dev.pump()
    assert not [e for e in evs if isinstance(e, TokenEmitted)]  # the step after the stop is not output
    term = _terminals(evs)["r"]
    assert term.state is S.COMPLETED and term.reason is EndReason.STOP and term.generated_tokens == 2
    dev.sched.check_invariants()


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.FAULT, JobStatus.TIMEOUT])
def test_a_stop_string_survives_a_failed_last_step(clock: FakeClock, status: JobStatus) -> None:
    """The client already has its whole output: a failing step after the stop does not turn it into an error."""
    dev = make_device(clock)
    dev.add("r", prompt=10, max_tokens=20)
    dev.run(2)
    (job,) = dev.sched.schedule(clock.now).jobs
    dev.sched.stop(RequestId("r"), clock.now)
    dev.update(dev.outcome(job, status), clock.now)
    term = _terminals(dev.pump())["r"]
    assert term.state is S.COMPLETED and term.reason is EndReason.STOP


def test_a_stop_string_survives_a_retired_generation(clock: FakeClock) -> None:
    """A board reset while a stopped request's job drains: the client has its output (Completed/STOP); a request
    the reset catches without a stop fails GENERATION_RETIRED."""
    dev = make_device(clock)
    for rid in ("stopped", "plain"):
        dev.add(rid, prompt=10, max_tokens=20)
    dev.run(4)
    jobs = dev.sched.schedule(clock.now).jobs
    assert jobs and _state(dev, "stopped") is S.DECODE_RUNNING
    assert dev.sched.stop(RequestId("stopped"), clock.now) is CancelOutcome.FLAGGED
    dev.sched.retire_generation(clock.now, "board reset")
    terms = _terminals(dev.pump())
    assert (terms["stopped"].state, terms["stopped"].reason) == (S.COMPLETED, EndReason.STOP)
    assert (terms["plain"].state, terms["plain"].reason) == (S.FAILED, EndReason.GENERATION_RETIRED)


def test_batching_window_with_measured_step_never_lets_the_earliest_deadline_expire(clock: FakeClock) -> None:
    """000 §7.2 rule 4 (issue 19): the scheduler measures its decode steps; a request held by the window
    for fill is fired one measured step before its deadline and finishes instead of expiring."""
    dev = make_device(
        clock, profiles=(B1, bprofile(4)), decode=DecodeOptions(batching_window_s=10.0), max_inflight_jobs=1
    )
    dev.add("warm", max_tokens=2)
    for _ in range(6):  # prefill, then decode steps that each take 0.1 s on the "device"
        out = dev.sched.schedule(clock.now)
        if not out.jobs:
            break
        clock.advance(0.1)
        dev.update(dev.outcome(out.jobs[0]), clock.now)
        dev.pump()
    assert dev.sched.decode.measured_step_s == pytest.approx(0.1)
    dev.add("urgent", max_tokens=2, deadline_s=1.0)
    finished = {}
    for _ in range(200):
        out = dev.sched.schedule(clock.now)
        if out.jobs:
            clock.advance(0.1)
            dev.update(dev.outcome(out.jobs[0]), clock.now)
        elif out.wake_at is not None:
            clock.now = max(clock.now, out.wake_at)
        finished.update(_terminals(dev.pump()))
        if "urgent" in finished:
            break
    assert finished["urgent"].reason is EndReason.LENGTH
    dev.sched.check_invariants()


def test_each_deadline_expiry_gets_its_documented_status(clock: FakeClock) -> None:
    """000 §5.2 (issue 19): a deadline is never a device error, and each case ends as admission or the
    request's own state decided: queued for admission (model Ready) -> 429, what admission said; waiting
    for a loading model -> 503 model_unavailable; admitted but no output yet -> 503 deadline_exceeded;
    output begun -> the stream's error is ``deadline_exceeded``."""
    from calctl.serving import outcomes
    from calctl.serving.outcomes import ENDINGS, EngineOutcome
    from calctl.serving.protocol import RejectCode

    dev = make_device(clock, max_sequences=1)
    dev.add("holder", max_tokens=50)
    assert dev.add("queued", deadline_s=0.5).decision is AdmissionDecision.QUEUE
    clock.advance(1.0)
    dev.sched.schedule(clock.now)
    queued = _terminals(dev.pump())["queued"]
    assert queued.reason is EndReason.REJECTED_CAPACITY and _end_status(queued) == 429
    assert "expired while queued for admission" in queued.detail and queued.retry_after_s is not None

    loading = make_device(clock)
    loading.sched.set_model_state(ModelState.WARMING, clock.now)
    assert loading.add("early", deadline_s=0.5).decision is AdmissionDecision.QUEUE
    clock.advance(1.0)
    loading.sched.schedule(clock.now)
    early = _terminals(loading.pump())["early"]
    assert early.reason is EndReason.REJECTED_UNAVAILABLE and _end_status(early) == 503
    assert ENDINGS[early.reason].before_output is RejectCode.UNAVAILABLE and "Warming" in early.detail

    admitted = make_device(clock, max_inflight_jobs=1)
    admitted.add("first", max_tokens=50)
    admitted.add("second", deadline_s=0.5)  # admitted (a lane is free), waits behind first's prefill
    job = admitted.sched.schedule(clock.now).jobs[0]
    clock.advance(1.0)
    admitted.update(admitted.outcome(job), clock.now)
    admitted.sched.schedule(clock.now)
    second = _terminals(admitted.pump())["second"]
    assert second.reason is EndReason.DEADLINE and second.generated_tokens == 0
    assert _end_status(second) == 503 and ENDINGS[second.reason].before_output is RejectCode.DEADLINE
    assert outcomes.rejection(RejectCode.DEADLINE).code.value == "deadline_exceeded"
    assert outcomes.public_error(EngineOutcome.DEADLINE.value)[0] == "deadline_exceeded"  # after output began


def test_long_prefill_quota_caps_waiting_and_running_long_prompts(clock: FakeClock) -> None:
    """000 §6, 001 §9.3 "limit the admission and concurrency of long prefills" (issue 19): beyond
    ``max_waiting`` long prompts waiting for prefill a new one is 429 (short ones still pass); with two jobs
    in flight only ``max_running`` of them are long prefills."""
    from dataclasses import replace

    from calctl.serving.core import LongPrefillQuota, PrefillThresholds, Scheduler
    from tests.unit.serving.serving_helpers import FakeDevice, make_settings

    settings = replace(
        make_settings(max_inflight_jobs=2, context_limit=4096),
        prefill_thresholds=PrefillThresholds(64, 512),
        long_prefill=LongPrefillQuota(max_waiting=2, max_running=1),
    )
    dev = FakeDevice(Scheduler(settings, generation=ModelGenerationId(1)), clock)
    assert dev.add("long-1", prompt=1000).decision is AdmissionDecision.ADMIT
    assert dev.add("long-2", prompt=1000).decision is AdmissionDecision.ADMIT
    refused = dev.add("long-3", prompt=1000)
    assert refused.decision is AdmissionDecision.REJECT_CAPACITY and http_status_of_decision(refused.decision) == 429
    assert "long-prefill quota: 2 prompts over 512 tokens" in refused.reason and refused.retry_after_s
    assert _terminals(dev.pump())["long-3"].reason is EndReason.REJECTED_CAPACITY
    assert dev.add("short", prompt=10).decision is AdmissionDecision.ADMIT  # the quota is for long prompts only
    out = dev.sched.schedule(clock.now)
    kinds = sorted(_prefill(j).queue.value for j in out.jobs)
    assert len(out.jobs) == 2 and kinds.count("long") == 1, kinds  # max_running 1 of 2 in flight
    dev.sched.check_invariants()
    # long-1 started its prefill: it no longer waits, so another long prompt fits the quota again.
    assert dev.add("long-4", prompt=1000).decision is AdmissionDecision.ADMIT
    assert dev.add("long-5", prompt=1000).decision is AdmissionDecision.REJECT_CAPACITY
    # An invalid long prompt is still the 400 admission gives, not the quota's 429.
    assert dev.add("too-long", prompt=5000).decision is AdmissionDecision.REJECT_INVALID
    for job in out.jobs:
        dev.update(dev.outcome(job), clock.now)
    dev.run(40)
    ends = _terminals(dev.events)
    assert all(ends[r].reason is EndReason.LENGTH for r in ("long-1", "long-2", "short", "long-4"))
    dev.sched.check_invariants()
