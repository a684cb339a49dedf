"""Admission on the engine core's thread: an arrival becomes the scheduler's decision and the stream's answer.

"Where a 429 comes from" is answered in :mod:`calctl.serving.core.admission`, which decides every
``REJECT_CAPACITY``; this front turns the decision into a rejection code through
:data:`calctl.serving.outcomes.DECISION_REJECTION` and the API layer into HTTP. Every refusal is
decided before the response's first byte (000 §5.2): the HTTP layer awaits ``stream.admitted()``,
which this resolves, or fails with the rejection.
"""

from __future__ import annotations

from calctl.serving.core.admission import AdmissionDecision, AdmissionResult
from calctl.serving.core.ids import RequestId, TenantId
from calctl.serving.core.scheduler import Scheduler
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.output import OutputProcessor, RequestContext
from calctl.serving.engine.streams import EngineStream
from calctl.serving.outcomes import DECISION_REJECTION
from calctl.serving.protocol import EngineRejection, GenerationRequest, RejectCode


class AdmissionFront:
    """One alias's admission front: the scheduler decides, this answers the stream and meters the decision."""

    def __init__(self, alias: str, sched: Scheduler, out: OutputProcessor, known: set[str], metrics: EngineMetrics):
        self.alias = alias
        self._sched = sched
        self._out = out
        self._known = known
        self._m_decision = {v: metrics.admission.labels(alias, v.value) for v in AdmissionDecision}
        self._m_prompt = metrics.prompt_tokens.labels(alias)

    def arrive(self, req: GenerationRequest, stream: EngineStream, arrived: float, now: float) -> None:
        """Admit (the stream is told), queue for a lane (told when it gets one), or refuse (its rejection)."""
        rid = RequestId(req.request_id)
        ticket = self._sched.arrive(rid, TenantId(req.tenant), now)
        if isinstance(ticket, AdmissionResult):
            self._refuse(rid, stream, ticket)
            return
        self._out.requests[rid] = RequestContext(req, stream, arrived)
        result = self._sched.submit(
            ticket, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens, deadline_s=req.timeout_s, now=now
        )
        if not result.decision.accepted:
            self._out.requests.pop(rid, None)
            self._refuse(rid, stream, result)
            return
        self._m_decision[result.decision].inc()
        self._m_prompt.inc(len(req.prompt_ids))
        if result.decision is AdmissionDecision.ADMIT:
            stream.post_admitted()

    def refuse_early(self, req: GenerationRequest, *, failed: str | None, rejecting: bool) -> None:
        """The refusals that need no scheduler, raised at submit (any thread): an empty prompt, a core whose
        loop failed (``failed``), a reload in progress (``rejecting``: 503 and retry, 000 §11, 001 §11.2)."""
        if not req.prompt_ids:
            raise EngineRejection(
                RejectCode.INVALID, "the prompt is empty: at least one token is needed", param="prompt"
            )
        if failed is not None:
            raise EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} failed: {failed}")
        if rejecting:
            raise EngineRejection(
                RejectCode.UNAVAILABLE, f"model {self.alias!r} is being reloaded; retry shortly", retry_after_s=1.0
            )

    def refuse_unavailable(self, req: GenerationRequest, stream: EngineStream, why: str) -> None:
        """The request never reached the scheduler (the loop failed): 503."""
        self._known.discard(req.request_id)
        stream.post_rejected(EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} {why}"))

    def _refuse(self, rid: RequestId, stream: EngineStream, result: AdmissionResult) -> None:
        self._m_decision[result.decision].inc()
        self._known.discard(rid)
        stream.post_rejected(self.rejection(result))

    def rejection(self, result: AdmissionResult) -> EngineRejection:
        code = DECISION_REJECTION.get(result.decision, RejectCode.UNAVAILABLE)
        # A prompt too long for the model is the prompt's fault, whatever max_tokens says: the admission
        # result names the input (``prompt``; the chat endpoint reports it as ``messages``).
        param = result.field if code is RejectCode.INVALID else None
        return EngineRejection(code, f"{self.alias}: {result.reason}", param=param, retry_after_s=result.retry_after_s)


__all__ = ["AdmissionFront"]
