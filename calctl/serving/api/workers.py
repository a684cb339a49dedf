"""Worker threads for the API's work in proportion to a request's input (001 §9.2).

Parsing a body, validating it, rendering the chat template and tokenizing the
prompt take time in proportion to what the client sent: a megabyte prompt is
seconds of tokenizer. On the event loop that time stalls every other request,
both models' streams and ``/health/live``. :class:`PromptWorkers` keeps it off
the loop:

* ``parse``: one small pool for every body (JSON and the schema; bounded by the
  body-size limit, milliseconds);
* ``scan``: one thread for the byte scan of a large completions body
  (:func:`calctl.serving.api.bodies.refuse_long_ids`, numpy, which gives up
  the interpreter lock), at the prompt threads' lower priority;
* ``for_model(alias, big)``: pools per model for its prompts, so model A's large
  prompts wait for each other and never in front of model B's (001 §9.2: A's
  overload must not block B).

The tokenizer gives up the interpreter lock while it works
(:meth:`calctl.serving.text.TextCodec.encode`), so the loop runs meanwhile; but
it still takes a core, and on a busy host the event loop, the engine threads and
the device's would queue behind it for CPU. Large inputs (a body of
:data:`BIG_BODY` bytes or more) are therefore worked at a lower priority
(``nice`` +:data:`PROMPT_NICE`, Linux: per thread): their own pool per model,
and the byte scan's thread; they get the CPU that is left over. A small prompt
(the 2-token request beside them) keeps the normal priority: niced alike, it
would share the left-over CPU with the big ones one to one. The parse threads
keep the normal priority too, because JSON parsing holds the interpreter lock,
and a thread that holds it must not wait for CPU while the event loop waits for
it.

A body under :data:`INLINE_BODY` bytes skips the threads: it is parsed and its prompt built on the event loop.
Each hand-off to a worker and back wakes a sleeping thread, and on a virtual machine that is 145-225 µs
(P10-P90) a wake: the two round trips were about 0.6 ms of a short request's time to first token
(``benchmarks/bench_serve.py``, issue 55), several times the work itself. Under that size the work is bounded:
the worst text measured (random printable characters, the tokenizer's slowest) takes about 0.25 ms to tokenize,
the loop's time for one streamed token's event.

This module only owns the threads; what runs in them is the routes'.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: Threads per pool: enough for one big prompt not to hold up the next small one of the same model.
THREADS_PER_POOL = 2
#: How much lower the prompt threads' priority is (Linux nice; raising one's own nice needs no privilege).
PROMPT_NICE = 10
#: A prompt text of at least this many characters is followed by :func:`give_back_memory`.
BIG_INPUT = 1 << 20
#: A request body of at least this many bytes has its prompt worked at the lower priority.
BIG_BODY = 64 * 1024
#: A request body under this many bytes is parsed and tokenized on the event loop (see the module docstring).
INLINE_BODY = 512


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()
#: The longest rest :func:`paced` takes after one parse (a host so loaded that a parse took seconds).
MAX_REST_S = 1.0
#: At most one trim in this many seconds: a trim holds each malloc arena's lock while it walks it, the event
#: loop's included, so a client sending big prompts back to back must not buy one per request (measured: a
#: trim per 4 MiB body made model B's median TTFT 20x).
TRIM_EVERY_S = 2.0
_last_trim = -TRIM_EVERY_S


def give_back_memory() -> None:
    """Hand the heap the allocator keeps after a big input back to the system (glibc ``malloc_trim``; a no-op
    elsewhere). Tokenizing a 4 MiB prompt peaks near 350 MB in the worker thread's arena, which glibc would
    otherwise keep for good: the server's RSS went 137 -> 577 MB over four such requests and stayed (with the
    trim, 166 MB). Worker thread only: ctypes releases the interpreter lock, and the trim takes ~0.1 s."""
    global _last_trim
    now = time.monotonic()
    if _TRIM is None or now - _last_trim < TRIM_EVERY_S:
        return
    _last_trim = now
    _TRIM(0)


def _lower_priority() -> None:
    """Initializer of a low-priority thread: nice +PROMPT_NICE relative to the server's own (a server started
    under ``nice -n 15`` keeps its big-prompt threads below itself), for this thread only (Linux threads have
    their own)."""
    # Not Linux, or not allowed: the thread runs at the normal priority.
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + PROMPT_NICE))


def paced(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, then a rest as long as it took (worker thread). Parsing JSON holds the interpreter lock
    throughout, so a client sending the largest bodies back to back would hold it most of the time and the event
    loop (model B's streams, ``/health/live``) would wait for it; with the rest, big bodies, parsed one at a
    time, hold it at most half the time. Measured with 4 MiB token-id prompts sent back to back at load 29:
    model B's median TTFT went from 13 ms idle to 207 ms beside them unpaced."""
    start = time.monotonic()
    try:
        return fn(*args)
    finally:
        time.sleep(min(time.monotonic() - start, MAX_REST_S))


class PromptWorkers:
    """The API's worker pools (see the module docstring); threads start on first use."""

    def __init__(self, threads: int = THREADS_PER_POOL) -> None:
        self._threads = threads
        self._parse = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api-parse")
        self._parse_big = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-parse-big")
        self._scan = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-scan", initializer=_lower_priority)
        self._models: dict[tuple[str, bool], ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def parse(self, size: int) -> ThreadPoolExecutor:
        """The pool for parsing a body of ``size`` bytes: one thread for bodies of :data:`BIG_INPUT` or more
        (:func:`paced` keeps it off the interpreter lock half the time), two for the rest."""
        return self._parse_big if size >= BIG_INPUT else self._parse

    @property
    def scan(self) -> ThreadPoolExecutor:
        """The pool for scanning a large body's bytes: one thread, low priority (the work is numpy's, off the
        interpreter lock, so it only needs the CPU left over)."""
        return self._scan

    def for_model(self, alias: str, big: bool = False) -> ThreadPoolExecutor:
        """The pool of ``alias`` for a small prompt, or (``big``: a body of :data:`BIG_BODY` bytes or more) for a
        large one, at the lower priority. Call it only for an alias the engine serves, so the pools stay as few
        as the configured models (an unknown name is a 404 before it gets here)."""
        key = (alias, big)  # not a joined name: an alias "x-big" must not share the big pool of "x"
        pool = self._models.get(key)
        if pool is None:
            with self._lock:
                pool = self._models.get(key)
                if pool is None:
                    pool = ThreadPoolExecutor(
                        max_workers=self._threads,
                        thread_name_prefix=f"api-prompt-{alias}{'-big' if big else ''}",
                        initializer=_lower_priority if big else None,
                    )
                    self._models[key] = pool
        return pool

    def shutdown(self) -> None:
        """Stop the threads once the work queued finished; nobody waits (a tokenization runs to its end)."""
        for pool in (self._parse, self._parse_big, self._scan, *self._models.values()):
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "BIG_BODY",
    "BIG_INPUT",
    "INLINE_BODY",
    "PROMPT_NICE",
    "THREADS_PER_POOL",
    "PromptWorkers",
    "give_back_memory",
    "paced",
]
