"""Ways to talk to the API in tests (imported as ``api_harness``).

* :func:`scan_public` — the leak check applied to every public body the tests
  see: no chip id, no file path, no address (000 §16, 001 §10.1).
* :func:`parse_sse` — split a ``text/event-stream`` body into events.
* :class:`AsgiCall` — one request driven by hand over ASGI, in-process: the test
  reads the response message by message, can stop reading (back-pressure) and
  can send ``http.disconnect`` at the moment it chooses. httpx's ASGITransport
  buffers whole responses and only reports a disconnect after the response, so
  it cannot test a client that leaves.
* :class:`ServerThread` — uvicorn on 127.0.0.1 with a free port, in a thread,
  for the official ``openai`` client and for real socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from tests.waiting import wait_until

# A public API route in a message ("use /v1/completions") is not a leak; a file path is.
_ROUTE = re.compile(r"/v1/[a-z/]+|/health/[a-z/]*|/internal/[a-z/{}]*")
_LEAKS = [
    (re.compile(r"chip", re.I), "a chip id"),
    (re.compile(r"\bccu\d", re.I), "a core id"),
    (re.compile(r"0x[0-9a-f]+", re.I), "an address"),
    (re.compile(r"(?:^|[\s'\"(=:])(?:/[\w.@-]+){2,}"), "an absolute path"),
    (re.compile(r"[A-Za-z]:\\"), "a Windows path"),
    (re.compile(r"\.(?:elf|cmd|bin|npy|json|yaml|key|pub)\b"), "a file name"),
    (re.compile(r"fixtures|site-packages|Traceback", re.I), "an internal detail"),
]


def _strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in _strings(k) + _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


def scan_public(doc: Any) -> None:
    """AssertionError naming the leak if any string in ``doc`` shows a chip, path or address."""
    for text in _strings(doc):
        cleaned = _ROUTE.sub("", text)
        for pattern, what in _LEAKS:
            if pattern.search(cleaned):
                raise AssertionError(f"public response shows {what}: {text!r}")


def scan_body(content_type: str, body: bytes) -> None:
    """Scan a JSON or SSE response body (anything else is ignored: /metrics is not public JSON)."""
    if not body:
        return
    if content_type.startswith("application/json"):
        scan_public(json.loads(body))
    elif content_type.startswith("text/event-stream"):
        for event in parse_sse(body):
            if event.data != "[DONE]":
                scan_public(json.loads(event.data))


@dataclass(frozen=True)
class SseEvent:
    event: str | None
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(body: bytes | str) -> list[SseEvent]:
    text = body.decode() if isinstance(body, bytes) else body
    assert text == "" or text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        name, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        events.append(SseEvent(name, "\n".join(data)))
    return events


class AsgiCall:
    """One HTTP request to an ASGI app, with the client's side under the test's control."""

    def __init__(
        self, app: Any, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        self._app = app
        raw = json.dumps(body).encode() if body is not None else b""
        self._body = raw
        hdrs = {
            "host": "testserver",
            "content-type": "application/json",
            "content-length": str(len(raw)),
            **(headers or {}),
        }
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self._sent_body = False
        self._disconnect = asyncio.Event()
        self._messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._accept = asyncio.Semaphore(1_000_000)  # how many messages send() may deliver before it blocks
        self.send_blocked = asyncio.Event()  # the app is waiting in send() for a client that stopped reading
        self.task: asyncio.Task[None] | None = None
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""

    async def _receive(self) -> dict[str, Any]:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._disconnect.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if self._accept.locked():
            self.send_blocked.set()
        await self._accept.acquire()  # a client that stops reading: send() blocks, as on a full socket
        await self._messages.put(message)

    def start(self) -> AsgiCall:
        self.task = asyncio.ensure_future(self._app(self.scope, self._receive, self._send))
        return self

    def stop_reading(self) -> None:
        """From now on every send() blocks (the client's socket buffer is full)."""
        self._accept = asyncio.Semaphore(0)

    def disconnect(self) -> None:
        self._disconnect.set()

    async def _next(self, timeout: float) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self._messages.get(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no ASGI message within {timeout} s") from None

    async def start_response(self, timeout: float = 5.0) -> int:
        message = await self._next(timeout)
        assert message["type"] == "http.response.start", message
        self.status = message["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        return self.status

    async def read_events(self, count: int, timeout: float = 5.0) -> list[SseEvent]:
        """Read body messages until at least ``count`` SSE events have arrived."""
        while not (self.body.endswith(b"\n\n") and len(parse_sse(self.body)) >= count):
            message = await self._next(timeout)
            assert message["type"] == "http.response.body", message
            self.body += message.get("body", b"")
        return parse_sse(self.body)

    async def read_all(self, timeout: float = 5.0) -> bytes:
        while True:
            message = await self._next(timeout)
            assert message["type"] == "http.response.body", message
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                scan_body(self.headers.get("content-type", ""), self.body)
                return self.body

    async def done(self, timeout: float = 5.0) -> None:
        assert self.task is not None
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"the app did not finish the request within {timeout} s") from None

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


def free_socket() -> socket.socket:
    # IPPROTO_TCP, not 0: asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1:<free port> in a daemon thread; a context manager."""

    def __init__(self, app: Any) -> None:
        self._sock = free_socket()
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True, name=f"uvicorn-{self.port}"
        )

    def __enter__(self) -> ServerThread:
        self._thread.start()

        def started() -> bool:  # uvicorn offers no event for this; it takes a few ms
            if not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start: its thread ended")
            return self.server.started

        wait_until(started, what="uvicorn to start", timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self._sock.close()
        assert not self._thread.is_alive(), "uvicorn did not shut down"
