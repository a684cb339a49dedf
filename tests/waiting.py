"""Wait for a condition with a deadline, instead of sleeping and hoping it has happened.

``wait_until(cond, what=...)`` polls ``cond`` until it returns true and fails the test, naming ``what``,
when the deadline passes. The deadline is generous (a loaded 2-core CI machine is slow); it bounds a hang,
it is not a timing assertion: a passing test takes as long as the condition takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0


def wait_until(cond: Callable[[], T], *, what: str, timeout: float = DEFAULT_TIMEOUT_S, interval: float = 0.005) -> T:
    """Return ``cond()``'s first truthy value; AssertionError naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
