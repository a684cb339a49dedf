"""Admission on the engine core's thread: an arrival becomes the scheduler's decision and the stream's answer.

"Where a 429 comes from" is answered in :mod:`calctl.serving.core.admission`, which decides every
``REJECT_CAPACITY``; this front turns the decision into a rejection code through
:data:`calctl.serving.outcomes.DECISION_REJECTION` and the API layer into HTTP. Every refusal is
decided before the response's first byte (000 §5.2): the HTTP layer awaits ``stream.admitted()``,
which this resolves, or fails with the rejection.
"""

from __future__ import annotations

from calctl.package.model import Model
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

    def __init__(
        self,
        alias: str,
        sched: Scheduler,
        out: OutputProcessor,
        known: set[str],
        metrics: EngineMetrics,
        model: Model,
    ):
        self.alias = alias
        self._vocab_size = model.architecture.vocab_size  # the model's embedding rows, not the tokenizer's
        self._sched = sched
        self._out = out
        self._known = known
        self._m_decision = {v: metrics.admission.labels(alias, v.value) for v in AdmissionDecision}
        self._m_prompt = metrics.prompt_tokens.labels(alias)

    def arrive(self, req: GenerationRequest, stream: EngineStream, arrived: float, now: float) -> None:
        """Admit (the stream is told), queue for a lane (told when it gets one), or refuse (its rejection)."""
        rid = RequestId(req.request_id)
        outside = self._outside_vocabulary(req)
        if outside is not None:
            self._known.discard(rid)
            self._out.refused(req, outside, now - arrived)
            stream.post_rejected(outside)
            return
        ticket = self._sched.arrive(rid, TenantId(req.tenant), now)
        if isinstance(ticket, AdmissionResult):
            self._refuse(req, stream, ticket, now - arrived)
            return
        self._out.requests[rid] = RequestContext(req, stream, arrived)
        result = self._sched.submit(
            ticket, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens, deadline_s=req.timeout_s, now=now
        )
        if not result.decision.accepted:
            self._out.requests.pop(rid, None)
            self._refuse(req, stream, result, now - arrived)
            return
        self._m_decision[result.decision].inc()
        self._m_prompt.inc(len(req.prompt_ids))
        if result.decision is AdmissionDecision.ADMIT:
            stream.post_admitted()

    def refuse_early(self, req: GenerationRequest, *, failed: str | None, rejecting: bool) -> None:
        """The refusals that need no scheduler, raised at submit (any thread): an empty prompt, a core whose
        loop failed (``failed``), a reload in progress (``rejecting``: 503 and retry, 000 §11, 001 §11.2).
        Each is counted and recorded like any other request's end."""
        rejection = None
        if not req.prompt_ids:
            rejection = EngineRejection(
                RejectCode.INVALID, "the prompt is empty: at least one token is needed", param="prompt"
            )
        elif failed is not None:
            rejection = EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} failed: {failed}")
        elif rejecting:
            rejection = EngineRejection(
                RejectCode.UNAVAILABLE, f"model {self.alias!r} is being reloaded; retry shortly", retry_after_s=1.0
            )
        if rejection is not None:
            raise self.refuse_now(req, rejection)

    def refuse_now(self, req: GenerationRequest, rejection: EngineRejection) -> EngineRejection:
        """Count and record a refusal decided at submit (any thread); the caller raises what it returns."""
        self._out.refused(req, rejection, 0.0)
        return rejection

    def refuse_unavailable(self, req: GenerationRequest, stream: EngineStream, why: str) -> None:
        """The request never reached the scheduler (the loop failed): 503."""
        self._known.discard(req.request_id)
        stream.post_rejected(
            self.refuse_now(req, EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} {why}"))
        )

    def refuse_unheld(self, req: GenerationRequest, stream: EngineStream) -> None:
        """Admitting ``req`` failed (a bug: the loop dies): 503, unless the scheduler already holds it (then the
        dying loop ends it with everything it holds)."""
        if RequestId(req.request_id) not in self._out.requests:
            self.refuse_unavailable(req, stream, "failed")

    def _refuse(self, req: GenerationRequest, stream: EngineStream, result: AdmissionResult, waited: float) -> None:
        self._m_decision[result.decision].inc()
        self._known.discard(req.request_id)
        rejection = self.rejection(result)
        self._out.refused(req, rejection, waited)
        stream.post_rejected(rejection)

    def _outside_vocabulary(self, req: GenerationRequest) -> EngineRejection | None:
        """A prompt id the model has no embedding row for is the request's fault: a 400 naming the id and the
        vocabulary size before the device ever sees it (issue 54; the device would fail the job, a 503 "retry"
        that can never succeed). Any tokenizer can produce such an id (TOK002 counted entries, not ids), and
        a completions prompt may give ids directly. On the core's thread: one pass over the prompt."""
        vocab = self._vocab_size
        top = max(req.prompt_ids, default=0)
        if top < vocab:
            return None
        return EngineRejection(
            RejectCode.INVALID,
            f"{self.alias}: token id {top} is outside the model's vocabulary of {vocab} entries (ids 0-{vocab - 1})",
            param="prompt",
        )

    def rejection(self, result: AdmissionResult) -> EngineRejection:
        code = DECISION_REJECTION.get(result.decision, RejectCode.UNAVAILABLE)
        # A prompt too long for the model is the prompt's fault, whatever max_tokens says: the admission
        # result names the input (``prompt``; the chat endpoint reports it as ``messages``).
        param = result.field if code is RejectCode.INVALID else None
        return EngineRejection(code, f"{self.alias}: {result.reason}", param=param, retry_after_s=result.retry_after_s)


__all__ = ["AdmissionFront"]
