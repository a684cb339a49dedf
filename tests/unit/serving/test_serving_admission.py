"""AdmissionController: 000 §5.1 budgets, §5.2 results with numbers, atomic reservation, rollback, tenants."""

from __future__ import annotations

import pytest

from calctl.serving.core import (
    AdmissionController,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionResult,
    CapacityBudget,
    KvCapacity,
    KvLaneManager,
    LaneId,
    ModelGenerationId,
    ModelState,
    RequestId,
    TenantId,
    TenantPolicy,
    Ticket,
)
from calctl.serving.outcomes import http_status_of_decision

T = TenantId("t")


def _ctl(
    *,
    seqs: int = 2,
    kv_tokens: int = 10_000,
    max_seq: int = 4096,
    waiting: int = 4,
    waiting_tokens: int = 10_000,
    context: int = 256,
    deadline_s: float = 10.0,
    tenants: dict | None = None,
    state: ModelState = ModelState.READY,
) -> AdmissionController:
    kv = KvLaneManager(KvCapacity(seqs, kv_tokens, max_seq))
    return AdmissionController(
        CapacityBudget(seqs, kv_tokens, waiting, waiting_tokens, 1),
        AdmissionPolicy(context_limit=context, deadline_default_s=deadline_s, tenants=tenants or {}),
        kv,
        model_state=state,
        generation=ModelGenerationId(1),
    )


def _admit(
    ctl: AdmissionController,
    rid: str,
    *,
    prompt: int = 10,
    out: int = 10,
    tenant: str = "t",
    now: float = 0.0,
    deadline_s=None,
):
    return ctl.admit_now(
        RequestId(rid), TenantId(tenant), prompt_tokens=prompt, max_tokens=out, deadline_s=deadline_s, now=now
    )


def _clean(ctl: AdmissionController) -> None:
    ctl.check_invariants()
    st = ctl.stats()
    assert (st.waiting_requests, st.queued_requests, st.waiting_prompt_tokens) == (0, 0, 0)


def test_admit_when_ready_and_budget_suffices() -> None:
    """000 §5.2 Admit: generation Ready and budget sufficient -> a KV lane is reserved."""
    ctl = _ctl()
    r = _admit(ctl, "a")
    assert r.decision is AdmissionDecision.ADMIT and r.lane == 0 and http_status_of_decision(r.decision) is None
    assert r.deadline == pytest.approx(10.0)


def test_context_overflow_is_400_with_the_numbers() -> None:
    """000 §5.2 RejectInvalid (400): prompt/total context out of range, reason states the numbers."""
    ctl = _ctl(context=256)
    r = _admit(ctl, "a", prompt=300, out=100)
    assert r.decision is AdmissionDecision.REJECT_INVALID and http_status_of_decision(r.decision) == 400
    # The prompt alone leaves no room for one output token: the prompt is to blame, not max_tokens (issue 21).
    assert r.reason == "prompt has 300 tokens; with at least 1 output token it exceeds context limit 256"
    assert r.field == "prompt"
    _clean(ctl)


def test_a_prompt_that_fits_with_too_many_max_tokens_blames_max_tokens() -> None:
    ctl = _ctl(context=256)
    r = _admit(ctl, "a", prompt=200, out=100)
    assert r.decision is AdmissionDecision.REJECT_INVALID and r.field == "max_tokens"
    assert r.reason == "prompt has 200 tokens + max_tokens 100 exceeds context limit 256"
    _clean(ctl)


@pytest.mark.parametrize(
    ("prompt", "out", "deadline", "fragment"),
    [
        (0, 10, None, "prompt is empty (0 tokens)"),
        (10, 0, None, "max_tokens must be at least 1, got 0"),
        (10, 10, -0.5, "deadline must be a positive number"),
    ],
)
def test_other_invalid_requests_are_400(prompt: int, out: int, deadline, fragment: str) -> None:
    """000 §5.2 RejectInvalid: empty prompt, no output budget, nonsensical deadline."""
    ctl = _ctl()
    r = _admit(ctl, "a", prompt=prompt, out=out, deadline_s=deadline)
    assert r.decision is AdmissionDecision.REJECT_INVALID and fragment in r.reason
    _clean(ctl)


def test_request_larger_than_the_kv_budget_is_400_not_queued() -> None:
    """000 §5.1: never accept a request that must exceed KV memory, even if it could wait."""
    ctl = _ctl(kv_tokens=100, context=4096)
    r = _admit(ctl, "a", prompt=90, out=20)
    assert r.decision is AdmissionDecision.REJECT_INVALID and "exceeds the KV budget of 100 tokens" in r.reason


@pytest.mark.parametrize(
    "state", [ModelState.DRAINING, ModelState.RECOVERING, ModelState.FAILED, ModelState.UNLOADED, ModelState.UNLOADING]
)
def test_unavailable_model_is_503_with_retry_after(state: ModelState) -> None:
    """000 §5.2 RejectUnavailable (503): model draining/recovering/failed; a Retry-After hint is given."""
    ctl = _ctl(state=state)
    r = ctl.arrive(RequestId("a"), T, 0.0)
    assert isinstance(r, AdmissionResult) and r.decision is AdmissionDecision.REJECT_UNAVAILABLE
    assert http_status_of_decision(r.decision) == 503 and r.retry_after_s and state.value.lower() in r.reason


def test_loading_model_queues_as_waiting_model() -> None:
    """000 §2 WaitingModel: while the generation warms up requests wait (Queue) within their deadline."""
    ctl = _ctl(state=ModelState.WARMING)
    r = _admit(ctl, "a")
    assert r.decision is AdmissionDecision.QUEUE and "waiting for the model" in r.reason
    assert ctl.promote(0.0) == []
    ctl.set_model_state(ModelState.READY)
    assert [a.request_id for a in ctl.promote(0.1)] == ["a"]
    ctl.check_invariants()


def test_queue_when_no_lane_then_promote_on_release() -> None:
    """000 §5.2 Queue: keep waiting while there is hope before the deadline; promoted when room appears."""
    ctl = _ctl(seqs=1)
    assert _admit(ctl, "a").decision is AdmissionDecision.ADMIT
    q = _admit(ctl, "b")
    assert q.decision is AdmissionDecision.QUEUE and "0 of 1 lanes free" in q.reason
    assert ctl.promote(1.0) == []
    # the scheduler frees the KV lane once the runtime confirmed it; admission frees the tenant slot
    ctl._kv.release(LaneId(0))
    ctl._kv.confirm_released(LaneId(0))
    ctl.release(RequestId("a"), served_prompt_tokens=10, served_output_tokens=10)
    promoted = ctl.promote(1.0)
    assert [p.request_id for p in promoted] == ["b"]
    ctl.check_invariants()


def test_full_waiting_queue_is_429_with_numbers() -> None:
    """000 §5.2 RejectCapacity (429): queue full; the reason states the count and the cap."""
    ctl = _ctl(seqs=1, waiting=2)
    _admit(ctl, "a")
    assert _admit(ctl, "b").decision is AdmissionDecision.QUEUE
    assert _admit(ctl, "c").decision is AdmissionDecision.QUEUE
    r = _admit(ctl, "d")
    assert r.decision is AdmissionDecision.REJECT_CAPACITY and http_status_of_decision(r.decision) == 429
    assert r.reason == "2 requests already waiting (max_waiting_requests 2)" and r.retry_after_s == 1.0


def test_waiting_prompt_token_budget_is_429() -> None:
    """000 §5.1 max_waiting_prompt_tokens: check and count in one step."""
    ctl = _ctl(seqs=1, waiting_tokens=100)
    _admit(ctl, "a")
    assert _admit(ctl, "b", prompt=60).decision is AdmissionDecision.QUEUE
    r = _admit(ctl, "c", prompt=50)
    assert r.decision is AdmissionDecision.REJECT_CAPACITY
    assert r.reason == "60 waiting prompt tokens + 50 exceeds max_waiting_prompt_tokens 100"
    ctl.check_invariants()
    assert ctl.stats().waiting_prompt_tokens == 60


def test_burst_of_concurrent_arrivals_admits_exactly_the_cap() -> None:
    """000 §5: N arrivals interleaved before any decision (the await race) -> exactly K reservations."""
    k, n = 5, 40
    ctl = _ctl(seqs=1, waiting=k)
    tickets = [ctl.arrive(RequestId(f"r{i}"), T, 0.0) for i in range(n)]  # every arrival before any decide
    granted = [t for t in tickets if isinstance(t, Ticket)]
    rejected = [t for t in tickets if isinstance(t, AdmissionResult)]
    assert len(granted) == k and len(rejected) == n - k
    assert all(r.decision is AdmissionDecision.REJECT_CAPACITY for r in rejected)
    results = [ctl.decide(t, prompt_tokens=10, max_tokens=10, deadline_s=None, now=0.1) for t in granted]
    assert sum(r.decision is AdmissionDecision.ADMIT for r in results) == 1
    assert sum(r.decision is AdmissionDecision.QUEUE for r in results) == k - 1
    assert ctl.stats().waiting_requests == k - 1
    ctl.check_invariants()


def test_burst_against_active_sequence_cap() -> None:
    """000 §5.1 max_sequences: with K lanes a burst admits exactly K; the rest queue or 429, never more."""
    ctl = _ctl(seqs=3, waiting=50)
    results = [_admit(ctl, f"r{i}") for i in range(20)]
    assert sum(r.decision is AdmissionDecision.ADMIT for r in results) == 3
    assert ctl._kv.free_lanes == 0
    ctl.check_invariants()


def test_every_rejection_path_rolls_back() -> None:
    """000 §5: a reservation taken at arrival is released on every failure path (no leaked slot)."""
    ctl = _ctl(seqs=1, waiting=3, waiting_tokens=50, context=256, tenants={T: TenantPolicy(max_waiting_tokens=30)})
    _admit(ctl, "holder")  # takes the only lane so later requests must queue
    base = ctl.stats()
    paths: dict[str, tuple[int, int, float | None]] = {  # prompt tokens, max tokens, deadline
        "invalid": (300, 10, None),
        "tenant tokens": (40, 10, None),
        "expired deadline": (10, 10, 0.001),
    }
    for name, (prompt, out, deadline_s) in paths.items():
        ticket = ctl.arrive(RequestId(name), T, 0.0)
        assert isinstance(ticket, Ticket)
        r = ctl.decide(ticket, prompt_tokens=prompt, max_tokens=out, deadline_s=deadline_s, now=0.01)
        assert not r.decision.accepted, name
        assert ctl.stats() == base, name
        ctl.check_invariants()
    # abandon (tokenizer error / client gone before the prompt was counted)
    ticket = ctl.arrive(RequestId("abandoned"), T, 0.0)
    assert isinstance(ticket, Ticket) and ctl.stats().waiting_requests == 1
    assert ctl.abandon(RequestId("abandoned")) and not ctl.abandon(RequestId("abandoned"))
    assert ctl.stats() == base
    # cancel while queued
    assert _admit(ctl, "queued", prompt=20).decision is AdmissionDecision.QUEUE
    ctl.abandon(RequestId("queued"))
    assert ctl.stats() == base
    # expiry while queued
    assert _admit(ctl, "late", prompt=20, now=1.0, deadline_s=0.5).decision is AdmissionDecision.QUEUE
    expired = ctl.expire(2.0)
    assert [rid for rid, _ in expired] == ["late"] and "expired while queued" in expired[0][1].reason
    assert ctl.stats() == base
    # drain withdraws the queue with 503
    assert _admit(ctl, "drained", prompt=20, now=2.0).decision is AdmissionDecision.QUEUE
    withdrawn = ctl.set_model_state(ModelState.DRAINING)
    assert [(rid, http_status_of_decision(r.decision)) for rid, r in withdrawn] == [("drained", 503)]
    assert ctl.stats() == base
    ctl.check_invariants()


def test_client_can_only_lower_the_deadline() -> None:
    """000 §5 deadlines: the server default applies; a client value larger than it is clamped."""
    ctl = _ctl(deadline_s=10.0)
    assert _admit(ctl, "a", deadline_s=60.0, now=1.0).deadline == pytest.approx(11.0)
    assert _admit(ctl, "b", deadline_s=2.0, now=1.0).deadline == pytest.approx(3.0)


def test_deadline_already_spent_before_decision_is_429() -> None:
    """000 §5.2: no hope before the deadline -> rejected with a reason naming the times."""
    ctl = _ctl()
    ticket = ctl.arrive(RequestId("a"), T, 0.0)
    assert isinstance(ticket, Ticket)
    r = ctl.decide(ticket, prompt_tokens=5, max_tokens=5, deadline_s=0.05, now=0.2)
    assert r.decision is AdmissionDecision.REJECT_CAPACITY
    assert r.reason == "deadline of 50 ms expired before admission (request arrived 200 ms ago)"


def test_ticket_expires_if_never_decided() -> None:
    """A ticket whose prompt is never counted cannot leak its slot: it expires at the default deadline."""
    ctl = _ctl(deadline_s=5.0, waiting=1)
    ticket = ctl.arrive(RequestId("a"), T, 0.0)
    assert isinstance(ticket, Ticket)
    assert ctl.next_deadline() == pytest.approx(5.0)
    assert [rid for rid, _ in ctl.expire(5.0)] == ["a"]
    _clean(ctl)
    late = ctl.decide(ticket, prompt_tokens=1, max_tokens=1, deadline_s=None, now=6.0)
    assert late.decision is AdmissionDecision.REJECT_CAPACITY


def test_tenant_qps_token_bucket_uses_the_given_clock() -> None:
    """000 §5.3 per-tenant QPS: a token bucket driven by `now`, with an exact Retry-After."""
    ctl = _ctl(waiting=100, tenants={T: TenantPolicy(qps=2.0)})
    assert isinstance(ctl.arrive(RequestId("a"), T, 0.0), Ticket)
    assert isinstance(ctl.arrive(RequestId("b"), T, 0.0), Ticket)  # burst = max(1, qps) = 2
    r = ctl.arrive(RequestId("c"), T, 0.1)
    assert isinstance(r, AdmissionResult) and r.decision is AdmissionDecision.REJECT_CAPACITY
    assert r.retry_after_s == pytest.approx(0.4) and "2 requests/s" in r.reason
    assert isinstance(ctl.arrive(RequestId("d"), T, 0.5), Ticket)
    assert isinstance(ctl.arrive(RequestId("other"), TenantId("u"), 0.5), Ticket)  # other tenants unaffected


def test_tenant_active_sequence_cap_parks_only_that_tenant() -> None:
    """000 §5.3 per-tenant active sequences: a capped tenant waits, others pass it."""
    ctl = _ctl(seqs=4, waiting=10, tenants={TenantId("a"): TenantPolicy(max_active_sequences=1)})
    assert _admit(ctl, "a1", tenant="a").decision is AdmissionDecision.ADMIT
    q = _admit(ctl, "a2", tenant="a")
    assert q.decision is AdmissionDecision.QUEUE and "1 active sequences (limit 1)" in q.reason
    assert _admit(ctl, "b1", tenant="b").decision is AdmissionDecision.ADMIT  # not blocked behind a2
    assert ctl.promote(0.0) == []
    ctl.release(RequestId("a1"), served_prompt_tokens=10, served_output_tokens=10)
    ctl._kv.release(LaneId(0))
    ctl._kv.confirm_released(LaneId(0))
    assert [p.request_id for p in ctl.promote(0.1)] == ["a2"]
    ctl.check_invariants()


def test_head_of_queue_is_not_overtaken_by_smaller_requests() -> None:
    """000 §5.3: long requests cannot starve; the WFQ head waits for room, smaller ones do not jump it."""
    ctl = _ctl(seqs=4, kv_tokens=100, context=100, waiting=10)
    assert _admit(ctl, "small", prompt=30, out=30).decision is AdmissionDecision.ADMIT  # 60 of 100 tokens
    assert _admit(ctl, "big", prompt=50, out=40).decision is AdmissionDecision.QUEUE  # needs 90
    assert _admit(ctl, "tiny", prompt=5, out=5).decision is AdmissionDecision.QUEUE  # would fit, but big is ahead
    assert ctl.promote(0.0) == []
