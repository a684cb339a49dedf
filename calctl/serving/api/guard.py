"""The ASGI layer in front of every route: liveness, the request body's size, ``X-Request-Id`` (001 §9.2, §14).

What one request sends must not stall the others (001 §9.2: A's overload never
blocks B), so before any route runs, :class:`RequestGuard`:

* answers ``GET /health/live`` itself, from a path that shares nothing with the
  scheduler, the engine or FastAPI's routing (docs/serve.md: a liveness probe
  that waits behind a big request gets the pod restarted, docs/deploy.md);
* reads the request body with the size limit enforced while it arrives, before
  anything parses it: a declared or streamed body over ``max_body_bytes`` is a
  413 whose message names the limit; the rest of such a body is read and dropped
  (up to :data:`DRAIN_FACTOR` times the limit) so that a client still sending
  it reads the 413 instead of a reset connection;
* joins a large body's chunks in a worker thread (a 4 MiB copy into fresh memory is milliseconds of
  page faults) and leaves it in the scope (:data:`BODY_SCOPE_KEY`), so the route reads it without the
  second copy ``Request.body()`` makes: nothing proportional to the body runs on the event loop;
* reads large bodies at a bounded rate across all connections
  (:class:`Intake`, a token bucket): past the first :data:`BIG_BODY` bytes of
  a body, :data:`INTAKE_BYTES_PER_S` with a burst of :data:`INTAKE_BURST`
  bytes; an occasional big body arrives at full speed, a client sending the
  largest bodies back to back is slowed by TCP's own back-pressure, so reading,
  scanning and refusing them cannot take the host's CPU from the other
  model's streams (measured: 4 MiB token-id bodies back to back arrived ~78 a
  second, 300 MB/s through the event loop; ~16 at 64 MiB/s, ~4 now);
* logs a client that aborts its upload as one line, not a traceback
  (``starlette.requests.ClientDisconnect``), and answers nothing: nobody listens;
* gives every response an ``X-Request-Id``: the completion's id where the route
  set one, else a fresh ``req-...`` id (401, 404, 413, health, admin).

It does not parse JSON, know models or tokenize: the routes do that, off the
event loop (:mod:`calctl.serving.api.openai`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calctl.serving.api.bodies import ids_prompt
from calctl.serving.api.errors import INVALID, error_body
from calctl.serving.api.workers import BIG_BODY

log = logging.getLogger("calctl.serving.api")

#: The default ``max_body_bytes``: a full 128K-token prompt as text (~0.5 MB) or as token ids (~0.9 MB) fits
#: four times over; a 10 MB prompt is refused while it arrives (docs/serve.md "Request size").
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: An over-limit body is read and dropped up to this many times the limit before the 413; past it (or when
#: its declared length is past it) the 413 goes out at once and the connection closes.
DRAIN_FACTOR = 4
#: What the server reads per second of large bodies, all connections together (past each body's first BIG_BODY
#: bytes), and the burst it reads at full speed: two bodies of the default limit. 16 MiB/s is four of the
#: largest default bodies a second, more than the tokenizer or the device can make use of; what a flood of them
#: costs the host's CPU (the sender's, the kernel's, the server's reading and scanning) is in proportion to it.
INTAKE_BYTES_PER_S = 16 * 1024 * 1024
INTAKE_BURST = 8 * 1024 * 1024
REQUEST_ID_HEADER = b"x-request-id"
#: Where the guard leaves the body it read in the ASGI scope (bytes), for routes that want it without a copy.
BODY_SCOPE_KEY = "calctl.body"
#: A body of at least this many bytes is joined from its chunks in a worker thread, not on the event loop
#: (CPython's bytes.join releases the interpreter lock from 1 MiB on).
JOIN_OFF_LOOP = 1024 * 1024
_LIVE = json.dumps({"status": "live"}).encode()


class BodyTooLarge(Exception):
    """The request body is over the limit (413)."""


class Intake:
    """A token bucket of body bytes (event loop only): ``take(n)`` returns at once while the bucket holds
    them, else after the time the rate needs to refill what is missing. Takers queue in the order they asked."""

    def __init__(self, rate: float = INTAKE_BYTES_PER_S, burst: float = INTAKE_BURST) -> None:
        if rate <= 0 or burst < 0:
            raise ValueError(f"intake: rate {rate} must be > 0 and burst {burst} >= 0")
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._at = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate) - n
        self._at = now
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


class RequestGuard:
    """ASGI middleware: see the module docstring. ``max_body_bytes`` > 0."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, intake: Intake | None = None
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.intake = intake or Intake()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req-{uuid.uuid4().hex}"
        send = _with_request_id(send, request_id)
        if scope["path"] == "/health/live" and scope["method"] in ("GET", "HEAD"):
            await _respond(send, 200, _LIVE, head=scope["method"] == "HEAD")
            return
        if not _has_body(scope):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read_body(scope, receive)
        except BodyTooLarge:
            await _respond(send, 413, self._too_large_body(), close=True)
            return
        if body is None:
            log.info(
                "request %s %s %s: the client closed the connection while sending its body; dropped",
                request_id,
                scope["method"],
                scope["path"],
            )
            return
        scope[BODY_SCOPE_KEY] = body  # the routes read it here: Request.body() would copy it again, on the loop
        replay = _replay(body, receive)
        del body  # the scope and the replay hold it until the route takes it, not this frame for a whole stream
        await self.app(scope, replay, send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when the client left first; BodyTooLarge past the limit (declared or read)."""
        limit = self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and (declared > limit * DRAIN_FACTOR or (declared > limit and _expects(scope))):
            # Not worth draining, or not sent yet (``Expect: 100-continue``: the client waits for our word before
            # it sends the body, and the 413 is that word): answer now, the connection closes.
            raise BodyTooLarge
        parts: list[bytes] = []
        size = 0
        over = declared is not None and declared > limit
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                over = True
            if over:
                parts.clear()  # dropped as it arrives: an over-limit body never sits in memory
                if size > limit * DRAIN_FACTOR:
                    raise BodyTooLarge
            elif chunk:
                parts.append(chunk)
                if size > BIG_BODY:  # the bytes of this chunk past the body's first BIG_BODY
                    await self.intake.take(min(len(chunk), size - BIG_BODY))
            if not message.get("more_body", False):
                break
        if over:
            raise BodyTooLarge
        if size < JOIN_OFF_LOOP or not ids_prompt(parts[0]):
            return b"".join(parts)
        # A megabyte copy into memory the process just mapped is milliseconds of page faults: on the loop it
        # stalled every other request (4-5 ms of the loop's CPU per 4 MiB token-id body, measured). A worker thread
        # does it, and bytes.join gives up the interpreter lock while it copies this much. Only for a prompt of
        # token ids: a text prompt's body joined in a thread made B's P99 TTFT beside 4 MiB text bodies 3.1-3.9x
        # idle instead of 1.9-2.1x (bench_big_body.py, load ~1), although the loop's own CPU is the same.
        return await asyncio.get_running_loop().run_in_executor(None, join_parts, parts)

    def _too_large_body(self) -> bytes:
        limit = self.max_body_bytes
        message = (
            f"request body is larger than this server's limit of {limit} bytes ({_human(limit)}); "
            "send a shorter prompt (the operator sets the limit: --max-body-mb, or api.max_body_mb in the config)"
        )
        return json.dumps(error_body(message, type_=INVALID, code="request_too_large")).encode()


def join_parts(parts: list[bytes]) -> bytes:
    """The body from its chunks (a worker thread for a large body: see :meth:`RequestGuard._read_body`)."""
    return b"".join(parts)


def _human(size: int) -> str:
    return f"{size / 2**20:.4g} MiB" if size >= 2**20 else f"{size / 2**10:.4g} KiB"


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


def _expects(scope: Scope) -> bool:
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"])


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11/httptools) refuses a malformed length before we run
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then the client's own messages (``http.disconnect``). The body is
    not kept past its message: a streaming response listens on this ``receive`` for as long as it streams."""
    held: bytes | None = body

    async def replay() -> Message:
        nonlocal held
        if held is not None:
            message: Message = {"type": "http.request", "body": held, "more_body": False}
            held = None
            return message
        return await receive()

    return replay


def _with_request_id(send: Send, request_id: str) -> Send:
    """``send`` that adds ``X-Request-Id`` to the response's start when the route did not set one."""

    async def tagged(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if not any(name.lower() == REQUEST_ID_HEADER for name, _ in headers):
                headers.append((REQUEST_ID_HEADER, request_id.encode()))
                message = {**message, "headers": headers}
        await send(message)

    return tagged


async def _respond(send: Send, status: int, body: bytes, *, head: bool = False, close: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


__all__ = [
    "BODY_SCOPE_KEY",
    "DEFAULT_MAX_BODY_BYTES",
    "DRAIN_FACTOR",
    "INTAKE_BURST",
    "INTAKE_BYTES_PER_S",
    "JOIN_OFF_LOOP",
    "BodyTooLarge",
    "Intake",
    "RequestGuard",
    "join_parts",
]
