"""RequestRegistry: transitions, idempotent cancel, terminal-once, stale callbacks (000 §2, §4)."""

from __future__ import annotations

import pytest

from calctl.serving.core import (
    CallbackDisposition,
    CancelOutcome,
    EndReason,
    IllegalTransition,
    InvariantViolation,
    JobId,
    ModelGenerationId,
    RequestId,
    RequestRegistry,
    RequestState,
    TenantId,
)

S = RequestState
G1, G2 = ModelGenerationId(1), ModelGenerationId(2)


def _registry() -> tuple[RequestRegistry, list]:
    seen: list = []
    return RequestRegistry(lambda seq, ev, prev: seen.append((ev, prev))), seen


def _running(reg: RequestRegistry, rid: str = "r1", job: int = 7):
    seq = reg.create(RequestId(rid), TenantId("t"), 0.0)
    reg.move(seq, S.PREFILL_READY, 0.0)
    reg.start_job(seq, JobId(job), G1, 0.0)
    return seq


def test_happy_path_follows_000_s2_states() -> None:
    """000 §2 / 001 §9.1: New -> PrefillReady -> PrefillRunning -> DecodeReady -> DecodeRunning -> Finishing -> Completed."""
    reg, seen = _registry()
    seq = _running(reg)
    assert seq.state is S.PREFILL_RUNNING and seq.current_job == 7
    assert reg.check_callback(seq.request_id, G1, JobId(7)) is CallbackDisposition.ACCEPT
    reg.move(seq, S.DECODE_READY, 1.0)
    reg.start_job(seq, JobId(8), G1, 1.0)
    assert reg.check_callback(seq.request_id, G1, JobId(8)) is CallbackDisposition.ACCEPT
    reg.move(seq, S.FINISHING, 2.0)
    assert reg.finish(seq, S.COMPLETED, EndReason.LENGTH, 2.0)
    assert [e.state for e, _ in seen] == [S.COMPLETED]
    assert seen[0][0].job_id == 8 and seen[0][0].generation == G1
    assert reg.get(seq.request_id) is None and reg.final_state(seq.request_id) is S.COMPLETED


@pytest.mark.parametrize(
    ("src", "dst"),
    [(S.NEW, S.DECODE_READY), (S.NEW, S.PREFILL_RUNNING), (S.PREFILL_READY, S.DECODE_READY), (S.NEW, S.FINISHING)],
)
def test_illegal_transitions_raise(src: RequestState, dst: RequestState) -> None:
    """000 §2: only the table's transitions exist; anything else is a bug, not a silent overwrite."""
    reg, _ = _registry()
    seq = reg.create(RequestId("r"), TenantId("t"), 0.0)
    if src is S.PREFILL_READY:
        reg.move(seq, S.PREFILL_READY, 0.0)
    with pytest.raises(IllegalTransition):
        reg.move(seq, dst, 0.0)


def test_running_to_completed_must_pass_finishing() -> None:
    """000 §2: Completed is reached through Finishing only."""
    reg, _ = _registry()
    seq = _running(reg)
    reg.check_callback(seq.request_id, G1, JobId(7))
    with pytest.raises(IllegalTransition):
        reg.finish(seq, S.COMPLETED, EndReason.STOP, 0.0)


@pytest.mark.parametrize("state", [S.NEW, S.WAITING_MODEL, S.WAITING_ADMISSION, S.PREFILL_READY])
def test_cancel_is_immediate_before_running_and_idempotent(state: RequestState) -> None:
    """000 §4 rule 2: New/Waiting/Ready cancel at once; a second cancel changes nothing and emits nothing."""
    reg, seen = _registry()
    seq = reg.create(RequestId("r"), TenantId("t"), 0.0)
    if state is not S.NEW:
        reg.move(seq, state, 0.0)
    assert reg.cancel(seq.request_id, 1.0) is CancelOutcome.CANCELLED
    assert reg.cancel(seq.request_id, 2.0) is CancelOutcome.ALREADY_TERMINAL
    assert [(e.state, prev) for e, prev in seen] == [(S.CANCELLED, state)]


def test_cancel_while_running_only_flags_until_the_job_drains() -> None:
    """000 §4 rule 2: Running sets a flag; the job still drains; the callback then says CANCEL_DRAINED."""
    reg, seen = _registry()
    seq = _running(reg)
    assert reg.cancel(seq.request_id, 1.0) is CancelOutcome.FLAGGED
    assert reg.cancel(seq.request_id, 1.5) is CancelOutcome.ALREADY_REQUESTED
    assert seq.state is S.PREFILL_RUNNING and not seen
    with pytest.raises(InvariantViolation):  # cannot finish while the job holds it
        reg.finish(seq, S.CANCELLED, EndReason.CANCELLED, 1.6)
    assert reg.check_callback(seq.request_id, G1, JobId(7)) is CallbackDisposition.CANCEL_DRAINED
    assert reg.finish(seq, S.CANCELLED, EndReason.CANCELLED, 2.0)
    assert len(seen) == 1


def test_terminal_state_is_entered_once() -> None:
    """000 §4 rule 3: a second finish (e.g. cancel racing completion) returns False and emits nothing."""
    reg, seen = _registry()
    seq = reg.create(RequestId("r"), TenantId("t"), 0.0)
    assert reg.finish(seq, S.FAILED, EndReason.DEADLINE, 1.0)
    assert not reg.finish(seq, S.CANCELLED, EndReason.CANCELLED, 2.0)
    assert not reg.finish(seq, S.FAILED, EndReason.DEADLINE, 3.0)
    assert reg.terminal_events == 1 and len(seen) == 1


def test_stale_callbacks_are_reported_not_applied() -> None:
    """000 §4 rule 4: callbacks carry generation and job id; a mismatch is STALE and changes nothing."""
    reg, _ = _registry()
    seq = _running(reg, job=7)
    assert reg.check_callback(seq.request_id, G2, JobId(7)) is CallbackDisposition.STALE  # old/other generation
    assert reg.check_callback(seq.request_id, G1, JobId(6)) is CallbackDisposition.STALE  # old job
    assert reg.check_callback(RequestId("nobody"), G1, JobId(7)) is CallbackDisposition.STALE
    assert seq.current_job == 7 and seq.state is S.PREFILL_RUNNING
    assert reg.check_callback(seq.request_id, G1, JobId(7)) is CallbackDisposition.ACCEPT
    assert reg.check_callback(seq.request_id, G1, JobId(7)) is CallbackDisposition.STALE  # delivered twice


def test_detached_job_makes_its_late_completion_stale() -> None:
    """000 §4 rule 4: a retired (timed-out) job's completion is stale once the request moved on."""
    reg, _ = _registry()
    seq = _running(reg)
    assert reg.detach_job(seq) == 7
    reg.finish(seq, S.FAILED, EndReason.DEVICE_ERROR, 1.0)
    assert reg.check_callback(seq.request_id, G1, JobId(7)) is CallbackDisposition.STALE


def test_generation_is_pinned() -> None:
    """000 §10: a request keeps the generation it was created/admitted in."""
    reg, _ = _registry()
    seq = _running(reg)
    reg.check_callback(seq.request_id, G1, JobId(7))
    reg.move(seq, S.DECODE_READY, 0.0)
    with pytest.raises(InvariantViolation):
        reg.start_job(seq, JobId(9), G2, 0.0)


def test_duplicate_ids_and_forgetting() -> None:
    """Request ids are server-assigned: duplicates are bugs; terminal records are bounded."""
    reg = RequestRegistry(remember_terminal=2)
    seqs = [reg.create(RequestId(f"r{i}"), TenantId("t"), 0.0) for i in range(3)]
    with pytest.raises(InvariantViolation):
        reg.create(RequestId("r0"), TenantId("t"), 0.0)
    for s in seqs:
        reg.finish(s, S.CANCELLED, EndReason.CANCELLED, 1.0)
    assert reg.cancel(RequestId("r0"), 2.0) is CancelOutcome.UNKNOWN  # forgotten
    assert reg.cancel(RequestId("r2"), 2.0) is CancelOutcome.ALREADY_TERMINAL
    assert len(reg) == 0


@pytest.mark.parametrize("state_enum", ["RequestState", "KvState", "WorkKind", "ModelState"])
def test_hot_path_states_hash_by_identity(state_enum: str) -> None:
    """The core's hot-path enums share one identity-hashed base (set/dict lookups stay in C)."""
    import calctl.serving.core as core

    cls = getattr(core, state_enum)
    assert cls.__hash__ is object.__hash__
    members = list(cls)
    assert {m: i for i, m in enumerate(members)}[members[-1]] == len(members) - 1
