"""The one outcome table (issue 15 item 2): every core reason and verdict has exactly one row, and every layer
reads the same numbers from it."""

from __future__ import annotations

import pytest

from calctl.serving import outcomes
from calctl.serving.core.admission import AdmissionDecision
from calctl.serving.core.request import EndReason
from calctl.serving.outcomes import DECISION_REJECTION, ENDINGS, REJECTIONS, EngineOutcome, RequestOutcome
from calctl.serving.protocol import FinishReason, RejectCode


def test_every_core_finish_reason_and_reject_code_has_a_row() -> None:
    assert set(ENDINGS) == set(EndReason)
    assert set(REJECTIONS) == set(RejectCode)
    assert set(DECISION_REJECTION) == {v for v in AdmissionDecision if not v.accepted}


@pytest.mark.parametrize(
    ("verdict", "status", "type_", "code"),
    [
        (AdmissionDecision.REJECT_INVALID, 400, "invalid_request_error", "invalid_request_error"),
        (AdmissionDecision.REJECT_CAPACITY, 429, "rate_limit_error", "rate_limit_exceeded"),
        (AdmissionDecision.REJECT_UNAVAILABLE, 503, "service_unavailable", "model_unavailable"),
    ],
)
def test_a_verdict_is_one_http_error(verdict: AdmissionDecision, status: int, type_: str, code: str) -> None:
    r = outcomes.rejection(DECISION_REJECTION[verdict])
    assert (r.http_status, r.error_type, r.code.value) == (status, type_, code)
    assert outcomes.http_status_of_decision(verdict) == status
    # The HTTP client and the in-process client classify it the same way.
    assert outcomes.client_outcome_of_status(status, code) is outcomes.client_outcome_of_rejection(r.code)


def test_the_core_carries_no_http_numbers() -> None:
    from calctl.serving.core.admission import AdmissionResult
    from calctl.serving.core.request import TerminalEvent

    assert not hasattr(AdmissionDecision.REJECT_CAPACITY, "http_status")
    assert "http_status" not in AdmissionResult.__dataclass_fields__
    assert "http_status" not in TerminalEvent.__dataclass_fields__


def test_endings_before_and_after_output() -> None:
    # A device error before the first token is a 503; after it, the stream ends in error.
    assert outcomes.http_status_of_end(EndReason.DEVICE_ERROR, 0) == 503
    assert outcomes.http_status_of_end(EndReason.DEVICE_ERROR, 3) is None
    assert ENDINGS[EndReason.DEVICE_ERROR].finish is FinishReason.ERROR
    # A stop string and EOS are the same normal finish; a cancel is never an HTTP error.
    assert ENDINGS[EndReason.STOP].finish is FinishReason.STOP and ENDINGS[EndReason.STOP].outcome is EngineOutcome.STOP
    assert outcomes.http_status_of_end(EndReason.CANCELLED, 0) is None
    # A deadline is the request's own, not a fault, in every vocabulary.
    assert outcomes.client_outcome_of_end(FinishReason.ERROR, EngineOutcome.DEADLINE.value) is RequestOutcome.DEADLINE
    assert outcomes.client_outcome_of_end(FinishReason.ERROR, None) is RequestOutcome.DEVICE_ERROR
    assert outcomes.client_outcome_of_end(FinishReason.STOP, "stop") is RequestOutcome.OK


def test_a_status_from_another_server_is_classified_by_status() -> None:
    assert outcomes.client_outcome_of_status(429, "something_else") is RequestOutcome.CAPACITY
    assert outcomes.client_outcome_of_status(503, None) is RequestOutcome.UNAVAILABLE
    assert outcomes.client_outcome_of_status(500, None) is RequestOutcome.TRANSPORT
    assert outcomes.client_outcome_of_status(503, "deadline_exceeded") is RequestOutcome.DEADLINE


def test_a_deadline_after_admission_but_before_output_is_a_deadline_not_a_device_error() -> None:
    """Found by the rework: the soak counted these as unexplained device errors."""
    import asyncio

    from calctl.serving.engine.streams import EngineStream
    from calctl.serving.protocol import EngineRejection

    async def run() -> RequestOutcome:
        loop = asyncio.get_running_loop()
        s = EngineStream("r", loop, on_cancel=lambda *_: None, on_finish=lambda *_: None)
        s.post_admitted()
        s.post_rejected(EngineRejection(RejectCode.DEADLINE, "m: deadline expired in PrefillReady"))
        await s.admitted()
        events = [ev async for ev in s]
        (end,) = events
        assert end.finish is FinishReason.ERROR
        return outcomes.client_outcome_of_end(end.finish, end.outcome)

    assert asyncio.run(run()) is RequestOutcome.DEADLINE


def test_every_failure_a_client_sees_before_output_has_public_text() -> None:
    """Hostile test of issue 19: a refusal before the first token carried the core's detail (a state name,
    the runtime's fault text with job and chip) to the client; every outcome that has a public text after
    output began has one before it too, and the others keep the core's numbers-only text."""
    from calctl.serving.outcomes import PUBLIC_BEFORE_OUTPUT, PUBLIC_ERROR, public_before_output

    assert set(PUBLIC_BEFORE_OUTPUT) == set(PUBLIC_ERROR)
    leak = "generation 1 retired: fault: CCU_EXCEPTION: chip 0 job 432"
    for outcome in PUBLIC_ERROR:
        assert public_before_output(outcome, leak) == PUBLIC_BEFORE_OUTPUT[outcome]
    assert public_before_output(EngineOutcome.CAPACITY, "8 requests already waiting") == "8 requests already waiting"
