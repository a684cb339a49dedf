"""tests/waiting.py, the one way a test waits: what it returns and what its failure says."""

from __future__ import annotations

import pytest

from tests.waiting import wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, "", "done", "later"])
    assert wait_until(lambda: next(answers), what="an answer", interval=0) == "done"


def test_a_timeout_names_what_was_awaited_and_what_was_seen() -> None:
    with pytest.raises(AssertionError, match=r"^timed out after 0 s waiting for the door to open: 3 knocks$"):
        wait_until(lambda: False, what="the door to open", timeout=0, interval=0, detail=lambda: "3 knocks")


def test_a_condition_that_raises_ends_the_wait_at_once() -> None:
    calls: list[int] = []

    def gone() -> bool:
        calls.append(1)
        raise RuntimeError("the server exited")

    with pytest.raises(RuntimeError, match="the server exited"):
        wait_until(gone, what="the server")
    assert calls == [1]
