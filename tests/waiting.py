"""Wait for a condition with a deadline, instead of sleeping and hoping it has happened.

``wait_until(cond, what=...)`` (``async_wait_until`` in a coroutine) polls ``cond`` until it returns true
and fails the test, naming ``what``, when the deadline passes. The deadline is generous (a loaded 2-core CI
machine is slow); it bounds a hang, it is not a timing assertion: a passing test takes as long as the
condition takes. ``cond`` may raise to end the wait at once (a server process that exited will never become
ready); ``detail`` adds what was seen to the timeout's message (a log's tail, how many records arrived).

``wait_http_ready`` is the one wait for a ``calctl serve`` subprocess: ``/health/ready`` answers 200.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0


def wait_until(
    cond: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.005,
    detail: Callable[[], object] | None = None,
) -> T:
    """Return ``cond()``'s first truthy value (never None); AssertionError naming ``what`` (and
    ``detail()``) after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not (value := cond()):
        _give_up_after(end, timeout, what, detail)
        time.sleep(interval)
    return value


async def async_wait_until(
    cond: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
    detail: Callable[[], object] | None = None,
) -> T:
    """:func:`wait_until` inside a coroutine: the event loop runs (its requests progress) between the polls."""
    import asyncio

    end = time.monotonic() + timeout
    while not (value := cond()):
        _give_up_after(end, timeout, what, detail)
        await asyncio.sleep(interval)
    return value


def _give_up_after(end: float, timeout: float, what: str, detail: Callable[[], object] | None) -> None:
    if time.monotonic() > end:
        seen = f": {detail()}" if detail is not None else ""
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a subprocess's log ("" before it exists)."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_http_ready(
    url: str,
    proc: subprocess.Popen[Any],
    *,
    log: Path,
    timeout: float,
    what: str = "calctl serve",
    interval: float = 0.2,
) -> None:
    """Wait until ``{url}/health/ready`` answers 200. The process exiting first fails at once; both failures
    quote the tail of ``log``."""
    import httpx  # only the tests that start a server need it

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode} before it was ready:\n{log_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health/ready", timeout=2).status_code == 200
        return False

    wait_until(ready, what=f"{what} to become ready", timeout=timeout, interval=interval, detail=lambda: log_tail(log))
