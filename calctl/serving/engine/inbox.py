"""The engine core's inbox: the only way other threads reach the core's state (vLLM v1's input queue).

API threads post :class:`Arrive`, :class:`Cancel` and :class:`Stop`; the device executor's completion
threads post "job done" / "job timed out"; the supervisor's lifecycle commands are :class:`Command`
values that :meth:`Inbox.call` posts and waits for, so every change of a core's state (its requests,
its lifecycle) happens on the core's own thread.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from calctl.serving.core.ids import RequestId
from calctl.serving.engine.streams import EngineStream
from calctl.serving.protocol import GenerationRequest

T = TypeVar("T")


@dataclass(frozen=True)
class Arrive:
    request: GenerationRequest
    stream: EngineStream
    at: float


@dataclass(frozen=True)
class Cancel:
    request_id: RequestId
    reason: str


@dataclass(frozen=True)
class Stop:
    request_id: RequestId


@dataclass(frozen=True)
class Command:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]

    def run(self) -> None:
        """Run on the loop; the result or the exception goes to the waiting caller."""
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn()
        except BaseException as exc:
            # Everything, as concurrent.futures' own worker does: the caller waits on this future, and an
            # exception that escaped here would end the loop thread with the command unanswered, so the caller
            # (seeing the loop gone) would run ``fn`` a second time itself (:meth:`Inbox.call`).
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


_WAKE = object()  # wake() posts it so a blocked get() returns; the core ignores it


class Inbox:
    def __init__(self) -> None:
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()

    def post(self, msg: object) -> None:
        self._q.put(msg)

    def wake(self) -> None:
        self._q.put(_WAKE)

    def call(self, fn: Callable[[], T], loop: threading.Thread, *, dead: bool) -> T:
        """Run ``fn`` on ``loop`` and return its result (its exception is raised here).

        When the loop is gone (``dead``, or the thread ended with the command still queued) nobody else
        touches its state any more, so the caller runs ``fn`` itself: teardown of an alias that failed."""
        if threading.current_thread() is loop or dead or not loop.is_alive():
            return fn()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._q.put(Command(fn, fut))
        while True:
            try:
                return fut.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if not loop.is_alive():  # the loop died with our command in its inbox
                    return fn()

    def drain(self, handle: Callable[[object], None], *, block: bool, timeout: float | None) -> int:
        """Hand every queued message to ``handle``; with ``block``, wait up to ``timeout`` (None: forever)
        for the first. Returns how many were handled."""
        handled = 0
        if block:
            try:
                handle(self._q.get(timeout=timeout))
            except queue.Empty:
                return 0
            handled = 1
        while True:
            try:
                msg = self._q.get_nowait()
            except queue.Empty:
                return handled
            handle(msg)
            handled += 1

    def close(self) -> list[Arrive]:
        """The loop died: run the commands still queued (their callers wait), return the arrivals to refuse."""
        arrivals: list[Arrive] = []
        while True:
            try:
                msg = self._q.get_nowait()
            except queue.Empty:
                return arrivals
            if isinstance(msg, Arrive):
                arrivals.append(msg)
            elif isinstance(msg, Command):
                msg.run()


__all__ = ["Arrive", "Cancel", "Command", "Inbox", "Stop"]
