"""One request as a client saw it (:class:`RequestRecord`), the outcome classes of its end, and
:func:`signals_held` for building an event loop safely: what the HTTP load generator
(:mod:`calctl.loadgen.http`) and the in-process clients of ``calctl soak`` and ``calctl bench``
(:mod:`calctl.runners.traffic`) share.

Outcome classes are one vocabulary for every transport (:class:`RequestOutcome`, from the one outcome table in
``calctl.serving.outcomes``), so a report counts errors by class the same way whatever the transport.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from calctl.serving import outcomes
from calctl.serving.outcomes import RequestOutcome
from calctl.serving.protocol import EngineRejection, RejectCode


def outcome_of_rejection(code: RejectCode) -> RequestOutcome:
    """A refusal before any token, by its code (the table in ``calctl.serving.outcomes``)."""
    return outcomes.client_outcome_of_rejection(code)


def outcome_of_status(status: int, code: str | None = None) -> RequestOutcome:
    """An HTTP error status (and the OpenAI error ``code``) as an outcome class."""
    return outcomes.client_outcome_of_status(status, code)


@dataclass
class RequestRecord:
    """One request from the client's side. Times are ``time.monotonic()`` seconds.

    ``token_times`` holds the arrival time of every event that carried output
    (a token in-process; an SSE chunk with text over HTTP, which may carry more
    than one token when the detokenizer held a partial character back).
    ``tokens`` is the completion-token count the server reported (usage), or
    the number of token events when it reported none.
    """

    alias: str
    kind: str
    sent: float
    prompt_tokens: int
    max_tokens: int
    scheduled: float | None = None  # open-loop arrival time it was planned for (bench)
    outcome: RequestOutcome = RequestOutcome.TRANSPORT
    status: int | None = None
    first_token: float | None = None
    end: float | None = None
    tokens: int = 0
    token_times: list[float] = field(default_factory=list, repr=False)
    finish: str | None = None
    error: str | None = None

    def rejected(self, exc: EngineRejection, now: float) -> None:
        """The engine refused it (synchronously or while it waited to be admitted): its outcome and HTTP status."""
        self.outcome, self.status = outcome_of_rejection(exc.code), outcomes.rejection(exc.code).http_status
        self.error, self.end = exc.message, now

    @property
    def ok(self) -> bool:
        return self.outcome is RequestOutcome.OK

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (tokens - 1): time per output token after the first (vLLM's definition)."""
        if self.end is None or self.first_token is None or self.tokens < 2:
            return None
        return (self.end - self.first_token) / (self.tokens - 1)

    def itls(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive output events."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM recorded, not acted on, while the body runs; the first one is re-raised after it.

    At Python level, not with ``pthread_sigmask``: a mask only keeps the signal from this thread, another thread
    of the process then receives it and Python still runs the handler here, in the main thread, mid-constructor.
    Only the main thread can install handlers; elsewhere the body runs as is (no handler runs there anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])  # now the command's own handler sees it


__all__ = ["RequestRecord", "outcome_of_rejection", "outcome_of_status", "signals_held"]
