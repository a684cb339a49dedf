"""OutputProcessor: what happens to a step's events once the scheduler produced them (vLLM v1 ``OutputProcessor``).

:class:`~calctl.serving.engine.loop.EngineCore` runs the loop and owns the
scheduler and the device; this module owns what comes out of a finished job:

* **sampling**: the job's logits become one token per lane (:meth:`OutputProcessor.sample`);
* **delivery**: ``TokenEmitted`` and ``TerminalEvent`` become stream posts (a request that ends
  before its first token is refused with its HTTP error, 000 §5.2; the engine's own text goes to
  the log, never the client, 001 §10.1);
* **metering**: TTFT, TPOT, tokens per tenant, end-to-end time, outcomes, starvation (000 §16);
* **records**: 001 §14's per-request record, kept for the recovery evidence and written with
  ``--records``.

Events that act on the device or the lifecycle (a lane to free, a recovery to ask for) are handed
back to the core, in order. Everything here runs on the core's thread.

Delivery taps (:meth:`OutputProcessor.add_taps`) see every token posted to a stream, after it was
posted; diagnostics that break the rules on purpose (``calctl soak --inject``, see
:mod:`calctl.runners.soak.inject`) are taps, never code in the engine. Launch taps see every job just
before it is launched (the soak records the batch and lane of each decode step, to name a wrong token's lane).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.serving import outcomes
from calctl.serving.core.ids import ModelGenerationId, RequestId
from calctl.serving.core.request import EndReason, TerminalEvent
from calctl.serving.core.scheduler import (
    DecodeJob,
    JobOutcome,
    JobStatus,
    LaneResult,
    PrefillJob,
    StaleCompletion,
    TokenEmitted,
)
from calctl.serving.engine.device import Finished, Inflight
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.sampling import TokenHistory, request_rng, sample_token, token_logprob, uses_history
from calctl.serving.engine.streams import EngineStream
from calctl.serving.outcomes import ENDINGS, Ending, EngineOutcome, public_before_output
from calctl.serving.protocol import (
    EngineRejection,
    FinishReason,
    GenerationRequest,
    Refusal,
    RejectCode,
    TokenEvent,
    TokenLogprob,
)
from calctl.serving.record_sink import ms
from calctl.serving.text import TextCodec, stopped_by_text

log = logging.getLogger("calctl.serve")

#: Sees each token event after it was posted to its stream (engine thread).
DeliveryTap = Callable[[EngineStream, TokenEvent], None]
#: Sees every job just before it is launched (a decode job's batch: its lanes and profile); diagnostics only.
LaunchTap = Callable[[PrefillJob | DecodeJob], None]


@dataclass
class RequestContext:
    """One admitted request as the output side tracks it: its stream, its sampler, its timings."""

    gen: GenerationRequest
    stream: EngineStream
    arrived: float
    rng: np.random.Generator | None = None  # made at its first sampled token: a greedy request needs none
    history: TokenHistory | None = None  # made at its first sampled token, only for a request with penalties
    logprob: TokenLogprob | None = None  # of the token sampled last, until its TokenEmitted carries it
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_job_at: float | None = None
    tokens: int = 0
    output_ids: list[int] | None = None  # kept only for a request with stop strings (see _reason_seen)


class OutputProcessor:
    """Samples, delivers, meters and records for one alias. Engine thread only."""

    def __init__(
        self,
        alias: str,
        chips: tuple[int, ...],
        codec: TextCodec,
        metrics: EngineMetrics,
        *,
        known: set[str],
        generation: Callable[[], ModelGenerationId],
        queue_class: Callable[[int], str],
        on_token_gap: Callable[[float], None],
    ) -> None:
        self.alias = alias
        self.chips = chips
        self.codec = codec
        self.requests: dict[RequestId, RequestContext] = {}
        self._known = known  # shared with the core: request ids submitted and not yet terminal
        self._generation = generation
        self._queue_class = queue_class
        self._on_token_gap = on_token_gap
        self._taps: list[DeliveryTap] = []
        self._launch_taps: list[LaunchTap] = []
        self._metrics = metrics
        m = metrics
        self._m_ttft = m.ttft.labels(alias)
        self._m_tpot = m.tpot.labels(alias)
        self._m_tokens = m.tokens.labels(alias)
        self._m_e2e = m.e2e.labels(alias)
        self._m_tenant: dict[str, Any] = {}
        self._m_stale = m.stale.labels(alias)
        self._m_queue = m.queue_time.labels(alias)
        self._m_batch_wait = m.batch_wait.labels(alias)
        for q in ("short", "medium", "long"):  # every class shows, 0 until a request starves (000 §16)
            m.starvation.labels(alias, q)
        self.m_outcome = {o: m.requests.labels(alias, o.value) for o in EngineOutcome}

    def add_taps(self, delivery: DeliveryTap | None, launch: LaunchTap | None) -> None:
        if delivery is not None:
            self._taps.append(delivery)
        if launch is not None:
            self._launch_taps.append(launch)

    def remove_tap(self, tap: DeliveryTap) -> None:
        if tap in self._taps:
            self._taps.remove(tap)

    # ------------------------------------------------------------------ launching

    def launching(self, job: PrefillJob | DecodeJob, now: float, window_opened: float | None, at: float) -> Any:
        """A job is about to be launched: meter it (000 §16 queue time of a request's first job, the decode
        batch's window wait) and return the prompt a prefill needs (None: a decode, or a request gone)."""
        for tap in self._launch_taps:
            tap(job)
        if isinstance(job, DecodeJob):
            self._m_batch_wait.observe(0.0 if window_opened is None else max(0.0, now - window_opened))
            return None
        ctx = self.requests.get(job.request_id)
        if ctx is None:
            return None
        if ctx.first_job_at is None:
            ctx.first_job_at = at
            self._m_queue.observe(at - ctx.arrived)
        return ctx.gen.prompt_ids

    # ------------------------------------------------------------------ sampling

    def sample(self, inf: Inflight, fin: Finished) -> JobOutcome:
        """The lane results of a job that succeeded: one sampled token per lane (EOS ends unless ignored)."""
        logits = fin.logits
        assert logits is not None
        eos = self.codec.eos_token_id
        results = []
        for lane, rid in enumerate(inf.request_ids):
            ctx = self.requests.get(rid)
            if ctx is None:  # ended meanwhile (its lane result is discarded by the scheduler)
                results.append(LaneResult(rid, int(np.argmax(logits[lane]))))
                continue
            token = self._sample_one(ctx, logits[lane])
            results.append(LaneResult(rid, token, stop=(not ctx.gen.ignore_eos) and token == eos))
        return JobOutcome(inf.job_id, inf.core.generation, JobStatus.OK, tuple(results))

    @staticmethod
    def _sample_one(ctx: RequestContext, row: np.ndarray) -> int:
        """One request's next token; its penalty history and (when asked for) log-probabilities updated."""
        sampling = ctx.gen.sampling
        if ctx.rng is None and not sampling.greedy:
            ctx.rng = request_rng(sampling.seed)
        if ctx.history is None and uses_history(sampling):
            ctx.history = TokenHistory.of(ctx.gen.prompt_ids)
        token = sample_token(row, sampling, ctx.rng, ctx.history)
        if ctx.history is not None:
            # Counted when sampled, not when delivered: the next job's sampling may run before this step's
            # events are delivered. A token that is never delivered ended its request, history and all.
            ctx.history.add(token)
        if sampling.logprobs is not None:
            ctx.logprob = token_logprob(row, token, sampling.logprobs)
        return token

    # ------------------------------------------------------------------ events -> streams

    def process(self, events: Iterable[object], now: float, generation: ModelGenerationId) -> list[object]:
        """Deliver the events this side owns; return the others (lanes to free, recoveries), in order.

        ``generation``: the job generation the tokens are tagged with (001 §13.1)."""
        rest = []
        for ev in events:
            if isinstance(ev, TokenEmitted):
                self._on_token(ev, now, generation)
            elif isinstance(ev, TerminalEvent):
                self._on_terminal(ev, now)
            elif isinstance(ev, StaleCompletion):
                self._m_stale.inc()
                log.info("engine %s: stale completion of job %s dropped (%s)", self.alias, ev.job_id, ev.reason)
            else:
                rest.append(ev)
        return rest

    def _on_token(self, ev: TokenEmitted, now: float, generation: ModelGenerationId) -> None:
        ctx = self.requests.get(ev.request_id)
        if ctx is None:
            return
        ctx.tokens = ev.index + 1
        if ctx.gen.stop:
            if ctx.output_ids is None:
                ctx.output_ids = []
            ctx.output_ids.append(ev.token_id)
        if ctx.first_token_at is None:
            ctx.first_token_at = now
            self._m_ttft.observe(now - ctx.arrived)
        elif ctx.last_token_at is not None:
            gap = now - ctx.last_token_at
            self._m_tpot.observe(gap)
            self._on_token_gap(gap)  # 000 §14 P99 regression
        ctx.last_token_at = now
        self._m_tokens.inc()
        tenant = self._m_tenant.get(ctx.gen.tenant)
        if tenant is None:
            tenant = self._m_tenant[ctx.gen.tenant] = self._metrics.tenant_tokens.labels(self.alias, ctx.gen.tenant)
        tenant.inc()
        logprob, ctx.logprob = ctx.logprob, None
        event = TokenEvent(
            ev.token_id,
            prompt_tokens=len(ctx.gen.prompt_ids),
            completion_tokens=ctx.tokens,
            generation=int(generation),
            logprob=logprob if logprob is not None and logprob.token_id == ev.token_id else None,
        )
        ctx.stream.post_token(event)
        for tap in tuple(self._taps):
            tap(ctx.stream, event)

    def _on_terminal(self, ev: TerminalEvent, now: float) -> None:
        ctx = self.requests.pop(ev.request_id, None)
        self._known.discard(ev.request_id)
        if ctx is None:
            # Not held here: refused at admission (the scheduler ends a refused request too, after
            # record_refusal counted and recorded it) or already ended. Counting it again made
            # calctl_requests_total disagree with the records: 2 for one context-limit 400.
            return
        end = ENDINGS[self._reason_seen(ev.reason, ctx)]
        self.m_outcome[end.outcome].inc()
        self._m_e2e.observe(now - ctx.arrived)
        if ev.reason is EndReason.DEADLINE and ctx.first_job_at is None:
            # 000 §16 starvation event: the deadline came before the request ever reached the device.
            self._metrics.starvation.labels(self.alias, self._queue_class(len(ctx.gen.prompt_ids))).inc()
        self._record_request(ev, ctx, end, now)  # written with --records; always kept for recovery evidence
        if ctx.tokens == 0 and end.before_output is not None:
            # No output yet: the request is refused with its HTTP error (a queued request's deadline, a reset).
            public = public_before_output(end.outcome, ev.detail)
            if public != ev.detail:  # the engine's own text (job, chip, fault) goes to the log, never the client
                log.warning("request %s on %s ended before output: %s", ev.request_id, self.alias, ev.detail)
            ctx.stream.post_rejected(
                EngineRejection(end.before_output, f"{self.alias}: {public}", retry_after_s=ev.retry_after_s)
            )
            return
        error = None
        if end.finish is FinishReason.ERROR:
            error = f"{self.alias}: {ev.reason.value}: {ev.detail}"
        ctx.stream.post_end(
            TokenEvent(
                None,
                end.finish,
                error=error,
                prompt_tokens=len(ctx.gen.prompt_ids),
                completion_tokens=ctx.tokens,
                outcome=end.outcome.value,
            )
        )

    def _reason_seen(self, reason: EndReason, ctx: RequestContext) -> EndReason:
        """The end the client was told. A stop string completed by the last token ``max_tokens`` allowed is
        ``stop`` in the response (the API matched it) although the scheduler ended the request for its length
        before the API's stop arrived; the record and ``calctl_requests_total`` say ``stop`` too (001 §14)."""
        stopped = (
            reason is EndReason.LENGTH
            and bool(ctx.output_ids)
            and stopped_by_text(self.codec, ctx.gen.stop, ctx.gen.prompt_ids, ctx.output_ids or ())
        )
        return EndReason.STOP if stopped else reason

    def _record_request(self, ev: TerminalEvent, ctx: RequestContext, end: Ending, now: float) -> None:
        """001 §14's per-request record (calctl.serving.record_sink): internal, so it may name the chips."""
        first, last = ctx.first_token_at, ctx.last_token_at
        tpot = (last - first) / (ctx.tokens - 1) if first is not None and last is not None and ctx.tokens > 1 else None
        self._metrics.records.request(
            request_id=str(ev.request_id),
            model_alias=self.alias,
            model_generation=int(self._generation()),
            chips=list(self.chips),
            tenant=ctx.gen.tenant,
            prompt_tokens=len(ctx.gen.prompt_ids),
            output_tokens=ctx.tokens,
            queue_ms=ms(None if ctx.first_job_at is None else ctx.first_job_at - ctx.arrived),
            ttft_ms=ms(None if first is None else first - ctx.arrived),
            tpot_ms=ms(tpot),
            e2e_ms=ms(now - ctx.arrived),
            finish_reason=end.finish.value if ctx.tokens or end.before_output is None else None,
            error_class=None if end.outcome.value in ("stop", "length") else end.outcome.value,
        )

    def refused(self, req: GenerationRequest, rejection: EngineRejection, elapsed_s: float) -> None:
        """A request refused at admission: see :func:`record_refusal`."""
        refusal = Refusal(req.request_id, self.alias, req.tenant, len(req.prompt_ids), rejection)
        record_refusal(self._metrics, self.alias, self.chips, int(self._generation()), refusal, elapsed_s)

    # ------------------------------------------------------------------ a bug in the loop

    def fail_all(self, reason: str) -> None:
        """The loop died: every request held ends (503 before output, an ``internal`` error after)."""
        for rid, ctx in list(self.requests.items()):
            self.m_outcome[EngineOutcome.INTERNAL].inc()
            if ctx.tokens == 0:
                ctx.stream.post_rejected(EngineRejection(RejectCode.UNAVAILABLE, f"{self.alias}: {reason}"))
            else:
                ctx.stream.post_end(
                    TokenEvent(
                        None,
                        FinishReason.ERROR,
                        error=f"{self.alias}: internal: {reason}",
                        prompt_tokens=len(ctx.gen.prompt_ids),
                        completion_tokens=ctx.tokens,
                        outcome=EngineOutcome.INTERNAL.value,
                    )
                )
            self._known.discard(rid)
        self.requests.clear()


def record_refusal(
    metrics: EngineMetrics,
    alias: str,
    chips: tuple[int, ...],
    generation: int | None,
    refusal: Refusal,
    elapsed_s: float,
    *,
    count: bool = True,
) -> None:
    """A request refused at admission (400, 429, 503 before the engine held it) is counted in
    ``calctl_requests_total`` (unless ``count`` is False: a model name a client made up is no label) and has
    its 001 §14 record, as every request has. Any thread: it touches only the counters and the record sink,
    both thread-safe."""
    outcome = outcomes.rejection(refusal.rejection.code).outcome
    if count:
        metrics.requests.labels(alias, outcome.value).inc()
    metrics.records.request(
        request_id=refusal.request_id,
        model_alias=alias,
        model_generation=generation,
        chips=list(chips),
        tenant=refusal.tenant,
        prompt_tokens=refusal.prompt_tokens,
        output_tokens=0,
        queue_ms=None,  # never queued for the device
        ttft_ms=None,
        tpot_ms=None,
        e2e_ms=ms(max(0.0, elapsed_s)),
        finish_reason=None,
        error_class=outcome.value,
    )


__all__ = ["DeliveryTap", "LaunchTap", "OutputProcessor", "RequestContext", "record_refusal"]
