"""Worker threads for the API's work in proportion to a request's input (001 §9.2).

Parsing a body, validating it, rendering the chat template and tokenizing the
prompt take time in proportion to what the client sent: a megabyte prompt is
seconds of tokenizer. On the event loop that time stalls every other request,
both models' streams and ``/health/live``. :class:`PromptWorkers` keeps it off
the loop:

* ``parse``: one small pool for every body (JSON and the schema; bounded by the
  body-size limit, milliseconds);
* ``for_model(alias)``: a pool per model for its prompts, so model A's large
  prompts wait for each other and never in front of model B's (001 §9.2: A's
  overload must not block B).

The tokenizer gives up the interpreter lock while it works
(:meth:`calctl.serving.text.TextCodec.encode`), so the loop runs meanwhile; but
it still takes a core, and on a busy host the event loop, the engine threads and
the device's would queue behind it for CPU. The prompt threads therefore run at
a lower priority (``nice`` +:data:`PROMPT_NICE`, Linux: per thread): a big
prompt gets the CPU that is left over. The parse threads keep the normal
priority, because JSON parsing holds the interpreter lock, and a thread that
holds it must not wait for CPU while the event loop waits for it.

This module only owns the threads; what runs in them is the routes'.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

#: Threads per pool: enough for one big prompt not to hold up the next small one of the same model.
THREADS_PER_POOL = 2
#: How much lower the prompt threads' priority is (Linux nice; raising one's own nice needs no privilege).
PROMPT_NICE = 10


def _lower_priority() -> None:
    """Initializer of a prompt thread: nice +PROMPT_NICE for this thread only (Linux threads have their own)."""
    # Not Linux, or not allowed: the thread runs at the normal priority.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PROMPT_NICE)


class PromptWorkers:
    """The API's worker pools (see the module docstring); threads start on first use."""

    def __init__(self, threads: int = THREADS_PER_POOL) -> None:
        self._threads = threads
        self.parse = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api-parse")
        self._models: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def for_model(self, alias: str) -> ThreadPoolExecutor:
        """The pool of ``alias``: call it only for an alias the engine serves, so the pools stay as few as the
        configured models (an unknown name is a 404 before it gets here)."""
        pool = self._models.get(alias)
        if pool is None:
            with self._lock:
                pool = self._models.get(alias)
                if pool is None:
                    pool = ThreadPoolExecutor(
                        max_workers=self._threads,
                        thread_name_prefix=f"api-prompt-{alias}",
                        initializer=_lower_priority,
                    )
                    self._models[alias] = pool
        return pool

    def shutdown(self) -> None:
        """Stop the threads once the work queued finished; nobody waits (a tokenization runs to its end)."""
        for pool in (self.parse, *self._models.values()):
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["PROMPT_NICE", "THREADS_PER_POOL", "PromptWorkers"]
