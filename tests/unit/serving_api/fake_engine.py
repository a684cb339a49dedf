"""A scripted, in-memory implementation of :class:`calctl.serving.protocol.EngineClient` for the HTTP tests.

Imported as ``fake_engine``. It is faithful where the API can tell the
difference: real :class:`TextCodec` objects built from the combined sample
package (model-a and model-b keep their own tokenizers), the same rejection
codes as the engine (unknown alias, alias not Ready, draining, prompt over the
context limit), token events that carry cumulative usage and exactly one
terminal event, ``cancel``/``finish`` that are idempotent in effect, and
tokens that may still arrive after ``finish()`` (a job already in flight, as
with the real thread-to-asyncio bridge).

What it adds is control and a record: a :class:`Script` says what one request
does (its text, EOS or not, hold in the queue, pause after N tokens, fail
mid-stream, reject), :class:`Latch` objects let a test wait for "the request is
queued" or "the API cancelled" from a coroutine or from another thread (the
uvicorn tests), and every call from the API is recorded.

It does no scheduling, no device work and no HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.serving.protocol import (
    EngineRejection,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    Refusal,
    RejectCode,
    TokenEvent,
)
from calctl.serving.text import TextCodec

REPO = Path(__file__).resolve().parents[3]
COMBINED = REPO / "fixtures" / "packages" / "combined"
ALIASES = ("model-a", "model-b")
CONTEXT_LIMIT = 256  # manifest.yaml: context_limit of both models
EOS_TOKEN_ID = 2  # manifest.yaml: eos_token_id of both models ("<|im_end|>")

DEFAULT_TEXT = "Hello world, the calculet says hi."
# What a real device fault message may look like: chip, address and path. The API must never show it.
DEVICE_FAULT = "CCU exception on chip 1, ccu0 pc=0xdeadbeef in /opt/calctl/pkgs/combined/model-a/decode/ccu0_chip1.elf"

_CODECS: dict[str, TextCodec] = {}


def package_codec(alias: str) -> TextCodec:
    """The alias's codec from the combined sample package (cached: tokenizers load in ~ms, tests make hundreds)."""
    if alias not in _CODECS:
        base = COMBINED / "tokenizer" / alias
        _CODECS[alias] = TextCodec.from_files(base / "tokenizer.json", base / "tokenizer_config.json", EOS_TOKEN_ID)
    return _CODECS[alias]


class Latch:
    """A one-shot flag that threads and coroutines (on any event loop) can wait for."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def set(self) -> None:
        with self._lock:
            self._flag.set()
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed; nobody is waiting any more
                loop.call_soon_threadsafe(event.set)

    def is_set(self) -> bool:
        return self._flag.is_set()

    def _register(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> bool:
        with self._lock:
            if self._flag.is_set():
                return True
            self._waiters.append((loop, event))
            return False

    async def wait(self, timeout: float | None = 5.0) -> None:
        await wait_any(self, timeout=timeout)

    def wait_blocking(self, timeout: float = 5.0) -> None:
        if not self._flag.wait(timeout):
            raise AssertionError(f"latch not set within {timeout} s")


async def wait_any(*latches: Latch, timeout: float | None = None) -> Latch:
    """Wait until one of ``latches`` is set and return it; AssertionError after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    for latch in latches:
        if latch._register(loop, event):
            return latch
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"no latch set within {timeout} s") from None
    return next(latch for latch in latches if latch.is_set())


@dataclass(frozen=True)
class Script:
    """What one request does in the fake engine."""

    text: str = DEFAULT_TEXT  # generated text; its token ids come from the alias's own tokenizer
    eos: bool = True  # after the text, the EOS token with finish=STOP; False: repeat the text until max_tokens
    hold_queued: bool = False  # admitted() waits until stream.release() (or a cancel)
    pause_after: int | None = None  # after this many tokens, wait until stream.release() (or a cancel)
    error_after: int | None = None  # after this many tokens, end with FinishReason.ERROR and DEVICE_FAULT
    raise_after: int | None = None  # after this many tokens, the iterator raises (an engine bug)
    reject: EngineRejection | None = None  # submit() raises this
    reject_queued: EngineRejection | None = None  # admitted() raises this (e.g. the deadline expired queued)
    inflight_after_finish: int = 1  # tokens already in flight that still arrive after finish()


class FakeStream:
    """One request's :class:`RequestStream`, recording what the API asked of it."""

    def __init__(self, request: GenerationRequest, script: Script, codec: TextCodec) -> None:
        self.request_id = request.request_id
        self.request = request
        self.script = script
        self._codec = codec
        self.cancel_calls: list[str] = []  # every call the API made, even repeated ones
        self.finish_calls: list[FinishReason] = []
        self.sent: list[TokenEvent] = []
        self.terminal: FinishReason | None = None
        self.queued = Latch()  # admitted() is holding the request in the queue
        self.paused = Latch()  # the iterator is holding after script.pause_after tokens
        self.released = Latch()  # set by the test: leave the queue / resume
        self.stopped = Latch()  # cancelled (by the API or DELETE) or finished early by the caller
        self.cancelled = Latch()  # the API called cancel()
        self.ended = Latch()  # the iterator returned or raised (terminal event sent, or abandoned after finish)
        self._stop_reason: FinishReason | None = None
        self._admitted = False

    # -- test side -------------------------------------------------------------------------

    def release(self) -> None:
        self.released.set()

    @property
    def outcome(self) -> FinishReason | None:
        """How the request ended for the engine: its terminal event, or why it was stopped early."""
        return self.terminal or self._stop_reason

    # -- engine side -----------------------------------------------------------------------

    def engine_cancel(self) -> bool:
        """DELETE /internal/requests/{id}: False if the request has already ended."""
        if self.terminal is not None or self._stop_reason is not None:
            return False
        self._stop_reason = FinishReason.CANCELLED
        self.stopped.set()
        return True

    # -- RequestStream ---------------------------------------------------------------------

    async def admitted(self) -> None:
        if self.script.hold_queued:
            self.queued.set()
            await wait_any(self.released, self.stopped)
        if self.script.reject_queued is not None and self._stop_reason is None:
            self.terminal = FinishReason.ERROR  # the rejection is this request's terminal outcome
            self.ended.set()
            raise self.script.reject_queued
        self._admitted = True

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    def _token_ids(self) -> Iterator[tuple[int, bool]]:
        """(token id, is EOS) in generation order."""
        ids = self._codec.encode(self.script.text)
        if self.script.eos:
            yield from ((t, False) for t in ids)
            yield EOS_TOKEN_ID, True
        else:
            yield from ((t, False) for t in itertools.cycle(ids))

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        assert self._admitted or self._stop_reason is not None, "the API iterated a stream before admitted() returned"
        prompt = len(self.request.prompt_ids)
        produced = 0
        inflight = self.script.inflight_after_finish
        tokens = self._token_ids()
        try:
            while True:
                if self._stop_reason is FinishReason.CANCELLED:
                    yield self._end(
                        TokenEvent(None, FinishReason.CANCELLED, prompt_tokens=prompt, completion_tokens=produced)
                    )
                    return
                if self._stop_reason is FinishReason.STOP:  # finish(): a few in-flight tokens, then silence
                    if inflight <= 0:
                        return
                    inflight -= 1
                elif produced == self.script.pause_after and not self.released.is_set():
                    self.paused.set()
                    await wait_any(self.released, self.stopped)
                    continue
                if produced == self.script.error_after:
                    yield self._end(
                        TokenEvent(
                            None,
                            FinishReason.ERROR,
                            error=DEVICE_FAULT,
                            prompt_tokens=prompt,
                            completion_tokens=produced,
                        )
                    )
                    return
                if produced == self.script.raise_after:
                    raise RuntimeError(f"engine bug: {DEVICE_FAULT}")
                token, is_eos = next(tokens)
                produced += 1
                finish: FinishReason | None = None
                if is_eos:
                    finish = FinishReason.STOP
                elif produced >= self.request.max_tokens or prompt + produced >= CONTEXT_LIMIT:
                    finish = FinishReason.LENGTH
                event = TokenEvent(token, finish, prompt_tokens=prompt, completion_tokens=produced)
                if finish is not None and self._stop_reason is None:
                    yield self._end(event)
                    return
                self.sent.append(event)
                yield event
                await asyncio.sleep(0)  # let the event loop run between tokens, as a real engine does
        finally:
            self.ended.set()

    def _end(self, event: TokenEvent) -> TokenEvent:
        assert self.terminal is None, "terminal event sent twice"
        self.terminal = event.finish
        self.sent.append(event)
        return event

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancel_calls.append(reason)
        self.cancelled.set()
        if self.terminal is None and self._stop_reason is None:
            self._stop_reason = FinishReason.CANCELLED
            self.stopped.set()

    def finish(self, reason: FinishReason) -> None:
        self.finish_calls.append(reason)
        if self.terminal is None and self._stop_reason is None:
            self._stop_reason = reason
            self.stopped.set()


class FakeEngine:
    """The :class:`EngineClient` protocol over scripted streams; ``calls`` records every method the API called."""

    def __init__(self, states: Mapping[str, str] | None = None) -> None:
        self.states: dict[str, str] = dict(states or {alias: "Ready" for alias in ALIASES})
        self.generation = {alias: 1 for alias in self.states}
        self.created = int(time.time()) - 3600
        self.draining = False
        self.broken = False  # every method raises: a wedged scheduler
        self.default_script = Script()
        self.scripts: list[Script] = []  # consumed one per submit(), before default_script
        self.calls: list[str] = []
        self.submitted: list[GenerationRequest] = []
        self.refusals: list[Refusal] = []  # the HTTP layer's own 400s it reported (EngineClient.refused)
        self.streams: list[FakeStream] = []
        self.engine_cancels: list[str] = []
        self.admin_calls: list[tuple[str, ...]] = []  # (alias, action) or (alias, action, package)
        self.admin_outcome: dict[str, Any] = {"ok": True}
        self.executor_calls: list[tuple[str, str | None]] = []
        self.executor_outcome_ok = True
        self._lock = threading.Lock()
        self._submit_latches: dict[int, Latch] = {}

    # -- test side -------------------------------------------------------------------------

    def script(self, **kw: Any) -> Script:
        """Queue a script for the next submit()."""
        s = Script(**kw)
        self.scripts.append(s)
        return s

    def _submit_latch(self, index: int) -> Latch:
        with self._lock:
            return self._submit_latches.setdefault(index, Latch())

    async def stream(self, index: int = 0, timeout: float = 5.0) -> FakeStream:
        await self._submit_latch(index).wait(timeout)
        return self.streams[index]

    def stream_blocking(self, index: int = 0, timeout: float = 5.0) -> FakeStream:
        self._submit_latch(index).wait_blocking(timeout)
        return self.streams[index]

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if self.broken:
            raise RuntimeError(f"scheduler wedged ({name})")

    def _known(self, alias: str) -> None:
        if alias not in self.states:
            # The protocol only promises the code; the API must supply param="model" itself.
            raise EngineRejection(RejectCode.MODEL_NOT_FOUND, f"The model {alias!r} does not exist")

    # -- Engine ----------------------------------------------------------------------------

    def codec(self, alias: str) -> TextCodec:
        self._enter("codec")
        self._known(alias)
        return package_codec(alias)

    def context_limit(self, alias: str) -> int:
        self._enter("context_limit")
        self._known(alias)
        return CONTEXT_LIMIT

    def models(self) -> list[ModelInfo]:
        self._enter("models")
        return [
            ModelInfo(
                alias=a,
                state=s,
                generation=self.generation[a] if s == "Ready" else None,
                context_limit=CONTEXT_LIMIT,
                created=self.created,
            )
            for a, s in self.states.items()
        ]

    def submit(self, request: GenerationRequest) -> FakeStream:
        self._enter("submit")
        self._known(request.alias)
        script = self.scripts.pop(0) if self.scripts else self.default_script
        if self.draining:
            raise EngineRejection(RejectCode.UNAVAILABLE, "the server is draining", retry_after_s=5)
        if self.states[request.alias] != "Ready":
            raise EngineRejection(
                RejectCode.UNAVAILABLE, f"model {request.alias!r} is {self.states[request.alias]}", retry_after_s=2.5
            )
        vocab = package_codec(request.alias).vocab_size
        if any(t < 0 or t >= vocab for t in request.prompt_ids):
            raise AssertionError("the API let a token id outside the vocabulary reach the engine")
        if len(request.prompt_ids) >= CONTEXT_LIMIT:
            raise EngineRejection(
                RejectCode.INVALID,
                f"the prompt has {len(request.prompt_ids)} tokens but the context "
                f"limit of {request.alias} is {CONTEXT_LIMIT}",
                param="prompt",
            )
        if script.reject is not None:
            raise script.reject
        stream = FakeStream(request, script, package_codec(request.alias))
        with self._lock:
            self.submitted.append(request)
            self.streams.append(stream)
            index = len(self.streams) - 1
        self._submit_latch(index).set()
        return stream

    def refused(self, refusal: Refusal) -> None:
        self.refusals.append(refusal)  # not an _enter: recording a refusal never touches the scheduler

    def cancel(self, request_id: str) -> bool:
        self._enter("cancel")
        self.engine_cancels.append(request_id)
        return any(s.request_id == request_id and s.engine_cancel() for s in self.streams)

    def is_ready(self, alias: str | None = None) -> bool:
        self._enter("is_ready")
        if alias is None:
            return all(state == "Ready" for state in self.states.values())
        return self.states.get(alias) == "Ready"

    def failures(self) -> dict[str, str]:
        return {}

    def status(self) -> dict[str, object]:
        return {"device": "fake", "models": dict(self.states), "recoveries": []}

    def trace(self, since_ns: int = 0) -> dict[str, object]:
        """No device behind the fake: no job intervals (``GET /internal/trace``)."""
        self._enter("trace")
        return {"device": "fake", "clock": "CLOCK_MONOTONIC", "events": []}

    def is_draining(self) -> bool:
        self._enter("is_draining")
        return self.draining

    async def admin(self, alias: str, action: str, package: str | None = None) -> Mapping[str, Any]:
        self._enter("admin")
        self.admin_calls.append((alias, action) if package is None else (alias, action, package))
        return {**self.admin_outcome, "alias": alias, "action": action}

    async def executor(self, alias: str, mode: str | None = None) -> Mapping[str, Any]:
        self._enter("executor")
        self.executor_calls.append((alias, mode))
        return {"ok": self.executor_outcome_ok, "alias": alias, "mode": mode or "sync"}

    def metrics_text(self) -> bytes:
        self._enter("metrics_text")
        return (
            b"# HELP calctl_requests_total Requests.\n# TYPE calctl_requests_total counter\ncalctl_requests_total 0.0\n"
        )
