"""The load generator's HTTP side: open-loop phases of streaming ``/v1/completions`` requests (httpx).

Each request is ``POST /v1/completions`` with the prompt as token ids,
``max_tokens``, ``stream: true`` and ``stream_options.include_usage`` (so the
completion-token count comes from the server, not from counting chunks). Times
on the client's monotonic clock: sent, first SSE chunk carrying text (TTFT),
every later text chunk (ITL), the end. An ``event: error`` after the first byte
is a device error; a stream that ends without ``[DONE]`` is a transport error;
a 4xx/5xx status is classed by status and OpenAI error code
(:func:`~calctl.loadgen.client.outcome_of_status`).

A phase sends every planned request at its arrival time, whatever the server is
doing (open loop), and is bounded in time: requests still open ``grace_s``
after the last arrival window closes are cancelled and recorded as ``timeout``.
Nothing here computes statistics.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from calctl.errors import UsageError
from calctl.loadgen.client import RequestRecord, outcome_of_status, signals_held
from calctl.loadgen.metrics import ModelStats, Slo, summarize
from calctl.loadgen.workload import PlannedRequest, offered_tokens
from calctl.serving.outcomes import RequestOutcome


@dataclass(frozen=True)
class HttpTarget:
    """The server under test. ``url`` is its base (``http://127.0.0.1:8000``; a trailing ``/v1`` is accepted)."""

    url: str
    api_key: str | None = None
    temperature: float = 1.0
    request_timeout_s: float = 60.0

    @property
    def base(self) -> str:
        u = self.url.rstrip("/")
        return u[: -len("/v1")] if u.endswith("/v1") else u

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def served_models(target: HttpTarget, timeout_s: float = 10.0) -> list[str]:
    """``GET /v1/models``: the aliases the server reports Ready. UsageError when it cannot be reached."""
    try:
        r = httpx.get(f"{target.base}/v1/models", headers=target.headers(), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UsageError(
            f"--url {target.url}: cannot reach the server ({type(exc).__name__}: {exc})",
            hint="start it first, e.g. `calctl serve --port 8000`",
        ) from None
    if r.status_code != 200:
        raise UsageError(
            f"--url {target.url}: GET /v1/models answered {r.status_code}",
            hint="pass --api-key if the server requires one",
        )
    try:
        return [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"--url {target.url}: GET /v1/models did not return an OpenAI model list") from None


def device_trace(target: HttpTarget, since_ns: int, timeout_s: float = 10.0) -> dict[str, Any] | str:
    """``GET /internal/trace?since_ns=N`` (admin key): the server's per-chip job intervals, or why not."""
    try:
        r = httpx.get(
            f"{target.base}/internal/trace", params={"since_ns": since_ns}, headers=target.headers(), timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        return f"GET /internal/trace failed ({type(exc).__name__}: {exc})"
    if r.status_code != 200:
        return (
            f"GET /internal/trace answered {r.status_code}: the per-chip trace needs the admin key "
            "(pass it as --api-key) on a server that exposes /internal"
        )
    try:
        body = r.json()
    except ValueError:
        return "GET /internal/trace did not return JSON"
    if not isinstance(body, dict) or not isinstance(body.get("events"), list):
        return "GET /internal/trace did not return {device, events: [...]}"
    return body


@dataclass
class PhaseResult:
    """One phase: its records (every planned request, in send order per model), start and end."""

    label: str
    t0: float
    duration_s: float
    t_end: float
    records: list[RequestRecord] = field(default_factory=list)
    host_load: tuple[float, ...] = ()  # the 1-minute load average at its start and end (calctl.checks.host)

    def of(self, alias: str) -> list[RequestRecord]:
        return [r for r in self.records if r.alias == alias]

    def stats(self, alias: str, workload: Sequence[PlannedRequest], *, slo: Slo, duration_s: float) -> ModelStats:
        """``alias``'s figures in this phase (:func:`~calctl.loadgen.metrics.summarize`), against the tokens its
        ``workload`` offered over ``duration_s``."""
        return summarize(
            alias,
            self.of(alias),
            t0=self.t0,
            slo=slo,
            duration_s=duration_s,
            offered_tokens=offered_tokens(workload),
        )


async def _one(
    client: httpx.AsyncClient,
    target: HttpTarget,
    alias: str,
    kind: str,
    req: PlannedRequest,
    seed: int,
    t0: float,
    rec_out: list[RequestRecord],
) -> None:
    """Send ``req`` at its arrival time (``t0`` + its offset) and record it in ``rec_out`` (an open loop)."""
    delay = t0 + req.offset_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    await _send(client, target, alias, kind, req, seed, t0, rec_out, None)


async def _client(
    client: httpx.AsyncClient,
    target: HttpTarget,
    alias: str,
    kind: str,
    queue: Iterator[tuple[int, PlannedRequest]],
    seed_of: Callable[[int], int],
    t0: float,
    rec_out: list[RequestRecord],
    send_until: float,
) -> None:
    """One of ``--max-concurrency`` clients of a model: takes the model's next planned request from ``queue``
    (shared by its N clients, in plan order), waits for its arrival time, sends it and waits for its end; stops
    once the phase's sending time is over. N of these are a closed loop of N clients with as many tasks as
    clients: a task per planned request (10,000 for a concurrency sweep) took a loaded host longer to start than
    a 1.5 s level lasts, and the level sent nothing."""
    for i, req in queue:
        delay = t0 + req.offset_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.monotonic() >= send_until:
            return
        await _send(client, target, alias, kind, req, seed_of(i), t0, rec_out, send_until)


async def _send(
    client: httpx.AsyncClient,
    target: HttpTarget,
    alias: str,
    kind: str,
    req: PlannedRequest,
    seed: int,
    t0: float,
    rec_out: list[RequestRecord],
    send_until: float | None,
) -> None:
    """Send ``req`` now (unless the phase's sending time is over: then never sent, never recorded), record it."""
    if send_until is not None and time.monotonic() >= send_until:
        return
    rec = RequestRecord(alias, kind, time.monotonic(), len(req.prompt_ids), req.max_tokens, scheduled=t0 + req.offset_s)
    rec_out.append(rec)
    path, body = request_body(alias, req, target.temperature, seed)
    try:
        await asyncio.wait_for(_stream(client, target, path, body, rec), target.request_timeout_s)
    except asyncio.TimeoutError:
        rec.outcome, rec.end = RequestOutcome.TIMEOUT, time.monotonic()
        rec.error = f"no end within {target.request_timeout_s:g} s"
    except httpx.HTTPError as exc:
        rec.outcome, rec.end = RequestOutcome.TRANSPORT, time.monotonic()
        rec.error = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        if rec.end is None:
            rec.outcome, rec.end, rec.error = RequestOutcome.TIMEOUT, time.monotonic(), "the phase ended first"
        raise


def request_body(alias: str, req: PlannedRequest, temperature: float, seed: int) -> tuple[str, dict[str, Any]]:
    """The endpoint and JSON body of one streaming request: a chat to ``/v1/chat/completions``, text or token ids
    to ``/v1/completions``; usage in the last chunk either way (the server's completion-token count)."""
    body: dict[str, Any] = {
        "model": alias,
        "max_tokens": req.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": temperature,
        "seed": seed,
    }
    if req.messages is not None:
        body["messages"] = [{"role": role, "content": content} for role, content in req.messages]
        return "/v1/chat/completions", body
    body["prompt"] = req.text if req.text is not None else list(req.prompt_ids)
    return "/v1/completions", body


def _chunk_text(choice: Mapping[str, Any]) -> str | None:
    """The text of one streamed choice: ``text`` (completions) or ``delta.content`` (chat)."""
    if choice.get("text"):
        return str(choice["text"])
    delta = choice.get("delta")
    return str(delta["content"]) if isinstance(delta, Mapping) and delta.get("content") else None


async def _stream(
    client: httpx.AsyncClient, target: HttpTarget, path: str, body: dict[str, Any], rec: RequestRecord
) -> None:
    async with client.stream("POST", f"{target.base}{path}", json=body, headers=target.headers()) as r:
        rec.status = r.status_code
        if r.status_code != 200:
            _refused(rec, r.status_code, await r.aread())
            return
        usage_tokens, done = await _read_events(r, rec)
        rec.end = time.monotonic()
        rec.tokens = usage_tokens if usage_tokens is not None else len(rec.token_times)
        if rec.outcome is not RequestOutcome.DEVICE_ERROR:
            _settle(rec, done)


def _refused(rec: RequestRecord, status: int, raw: bytes) -> None:
    """A response other than 200: its error code and message (the OpenAI error body), else its first bytes."""
    code = None
    try:
        err = json.loads(raw)["error"]
        code, rec.error = err.get("code"), err.get("message")
    except (ValueError, KeyError, TypeError):
        rec.error = raw[:200].decode(errors="replace")
    rec.outcome, rec.end = outcome_of_status(status, code), time.monotonic()


async def _read_events(r: httpx.Response, rec: RequestRecord) -> tuple[int | None, bool]:
    """Read the server-sent events into ``rec`` (token times, finish reason, an error event): the completion
    tokens the usage chunk counted (None without one), and whether the stream ended with ``[DONE]``."""
    error_event = False
    usage_tokens: int | None = None
    async for line in r.aiter_lines():
        if line.startswith("event: error"):
            error_event = True
            continue
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return usage_tokens, True
        doc = json.loads(data)
        if error_event:
            rec.outcome, rec.error = RequestOutcome.DEVICE_ERROR, (doc.get("error") or {}).get("message")
            break
        if doc.get("usage") and not doc.get("choices"):
            usage_tokens = int(doc["usage"].get("completion_tokens") or 0)
            if not rec.prompt_tokens:  # a text or chat prompt: only the server knows its tokens
                rec.prompt_tokens = int(doc["usage"].get("prompt_tokens") or 0)
            continue
        _chunk(rec, doc.get("choices") or (), time.monotonic())
    return usage_tokens, False


def _chunk(rec: RequestRecord, choices: Sequence[Mapping[str, Any]], now: float) -> None:
    for ch in choices:
        if _chunk_text(ch):
            if rec.first_token is None:
                rec.first_token = now
            rec.token_times.append(now)
        if ch.get("finish_reason"):
            rec.finish = ch["finish_reason"]


def _settle(rec: RequestRecord, done: bool) -> None:
    """The outcome of a stream that ended (``done``: with ``[DONE]``) by its finish reason."""
    if not done:
        rec.outcome, rec.error = RequestOutcome.TRANSPORT, "the stream ended without [DONE]"
    elif rec.finish in ("stop", "length"):
        rec.outcome = RequestOutcome.OK
    elif rec.finish == "cancelled":
        rec.outcome = RequestOutcome.CANCELLED
    else:
        rec.outcome, rec.error = RequestOutcome.DEVICE_ERROR, f"finish_reason {rec.finish!r}"


def run_phase(
    target: HttpTarget,
    workloads: Mapping[str, Sequence[PlannedRequest]],
    *,
    label: str,
    duration_s: float,
    grace_s: float,
    seed: int,
    kinds: Mapping[str, str] | None = None,
    max_concurrency: int | None = None,
) -> PhaseResult:
    """Send every planned request of every model at its offset from a common start; wait at most
    ``duration_s + grace_s``. Runs its own event loop (call it from a plain thread).

    ``max_concurrency`` (``--max-concurrency``): at most that many requests of each model in flight, the
    others wait for a slot (with every offset 0 this is a closed loop of N clients). A request that gets its
    slot only after ``duration_s`` is not sent and not recorded: the phase offers what it could send in time.

    Like :func:`asyncio.run`, except that SIGINT/SIGTERM are held while the loop and the phase's task are
    built: a signal landing inside the loop's constructor left a half-built loop whose finaliser printed a
    traceback, and a coroutine never awaited; held, it arrives once the task runs and unwinds it."""
    kinds = kinds or {}

    async def phase() -> PhaseResult:
        total = sum(len(w) for w in workloads.values())
        limits = httpx.Limits(max_connections=max(16, min(2048, total)), max_keepalive_connections=64)
        timeout = httpx.Timeout(connect=10.0, read=target.request_timeout_s, write=10.0, pool=target.request_timeout_s)
        records: list[RequestRecord] = []
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            t0 = time.monotonic() + 0.05  # every task is created before the first arrival
            tasks = []
            for stream, (alias, wl) in enumerate(workloads.items()):
                kind = kinds.get(alias, "load")

                def seed_of(i: int, stream: int = stream) -> int:
                    return (seed * 1_000_003 + stream * 100_003 + i) % 2**31

                if max_concurrency is not None:
                    # --max-concurrency holds per model (vLLM's, for one endpoint): one cap over both would make
                    # the client take turns between A and B, and a joint phase would measure the client, not the
                    # chips. N clients share the model's queue: a closed loop of N tasks.
                    queue = iter(enumerate(wl))
                    tasks += [
                        asyncio.create_task(
                            _client(client, target, alias, kind, queue, seed_of, t0, records, t0 + duration_s)
                        )
                        for _ in range(min(max_concurrency, len(wl)))
                    ]
                    continue
                tasks += [
                    asyncio.create_task(_one(client, target, alias, kind, req, seed_of(i), t0, records))
                    for i, req in enumerate(wl)
                ]
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + duration_s + grace_s - time.monotonic()))
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        records.sort(key=lambda r: (r.alias, r.sent))
        return PhaseResult(label, t0, duration_s, time.monotonic(), records)

    return _run_in_own_loop(phase)


def _run_in_own_loop(make: Callable[[], Coroutine[Any, Any, PhaseResult]]) -> PhaseResult:
    """:func:`asyncio.run` of ``make()``, with SIGINT/SIGTERM held while the loop and its task are built."""
    loop: asyncio.AbstractEventLoop | None = None
    try:
        with signals_held():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # as asyncio.run does
            task = loop.create_task(make())
        return loop.run_until_complete(task)
    finally:
        if loop is not None:
            _close_loop(loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What :func:`asyncio.run` does at the end: cancel what still runs, let it unwind, close."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


__all__ = ["HttpTarget", "PhaseResult", "device_trace", "run_phase", "served_models"]
