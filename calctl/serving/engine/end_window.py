"""Waking on time for a job's end: the wait for a job turns into short slices just before it is due.

A thread that blocks on a job for the whole of a decode step is asleep when the job ends, and on a virtual
machine a sleeping CPU takes long to wake: measured on the 2-core VM these benchmarks run on, a thread woken by
another after 3 ms asleep runs again 145-225 µs later (P10-P90), the same thread waiting in 50 µs slices since
shortly before 6-16 µs later (issue 55). The serving loop paid that once or twice a token: the job's end to the
thread waiting for it and, in async and ping/pong, that thread's post to the engine's thread.

So the engine learns, from the jobs of the same shape before, how long this one takes on the device, and a job
submitted alone gets a window: from :data:`LEAD_S` before its soonest expected end to :data:`LEAD_S` after its
latest. Inside it the engine waits on that job itself, in :data:`SLICE_S` slices (every executor mode: in async
and ping/pong its completion thread still waits too, and finds the job done); before it, any wait ends at its
opening; after it, waits are as before (a job that runs long costs no CPU). A shape whose recent device times
spread wider than :data:`MAX_SPREAD` gets no window: its end is not predictable.

It is the hybrid polling of the Linux block layer (``io_poll_delay``: sleep for about the expected completion
time, then poll), except that the slices are still waits on the job, so an end inside the window wakes the
thread at once rather than at the next poll. Nothing here decides when a job is done; only how long each wait is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from calctl.serving.core.scheduler import DecodeJob, PrefillJob

#: How long before the soonest expected end the window opens (and after the latest it closes).
LEAD_S = 300e-6
#: The length of one wait inside the window.
SLICE_S = 50e-6
#: How many recent jobs of one shape the expectation is made from.
RECENT = 8
#: No window when a shape's recent device times spread wider than this fraction of the shortest. A decoder
#: computing on the host's own cores (the mock at time scale 0) spreads 5-8 ms a step, and each slice's wake takes
#: the interpreter lock from it: with windows its steps took 5 % longer. A device job of one shape (the mock's
#: timing model) spreads well under this.
MAX_SPREAD = 0.1
#: Shapes remembered; past this the oldest is forgotten (a prefill's shape is its prompt length).
MAX_SHAPES = 256


@dataclass(frozen=True, slots=True)
class Window:
    """When, on the engine's clock, the waits for one job are slices."""

    opens: float
    closes: float

    def wait_s(self, now: float, timeout: float) -> float:
        """How long to wait now, at most ``timeout``: until the opening, one slice inside, ``timeout`` after."""
        if now < self.opens:
            return min(timeout, self.opens - now)
        if now < self.closes:
            return min(timeout, SLICE_S)
        return timeout

    def is_open(self, now: float) -> bool:
        return self.opens <= now < self.closes


class EndWindows:
    """Recent device times by job shape, and the window they give a job submitted alone."""

    def __init__(self) -> None:
        self._recent: dict[Hashable, deque[float]] = {}

    def observe(self, shape: Hashable, seconds: float) -> None:
        """A job of ``shape`` ran ``seconds`` on the device."""
        recent = self._recent.get(shape)
        if recent is None:
            if len(self._recent) >= MAX_SHAPES:
                self._recent.pop(next(iter(self._recent)))
            recent = self._recent[shape] = deque(maxlen=RECENT)
        recent.append(seconds)

    def window(self, shape: Hashable, submitted: float) -> Window | None:
        """The window of a job of ``shape`` submitted at ``submitted`` with nothing ahead of it on the device;
        None while the shape has no history, or its times spread too wide."""
        recent = self._recent.get(shape)
        if not recent:
            return None
        soonest, latest = min(recent), max(recent)
        if latest - soonest > MAX_SPREAD * soonest:
            return None
        return Window(submitted + soonest - LEAD_S, submitted + latest + LEAD_S)

    def forget(self) -> None:
        """Drop every expectation (a new generation of the model, a reset: the times may differ)."""
        self._recent.clear()


def job_shape(graph: str, job: PrefillJob | DecodeJob, lanes: int) -> tuple[str, int, int]:
    """What a job's duration depends on: its graph, and its ``lanes`` active lanes (decode) or its prompt length
    (prefill: a prompt half as long as the ones before it in a power-of-two bucket ends well before their window
    opens, and its end was noticed only then)."""
    if isinstance(job, PrefillJob):
        return graph, 0, job.prompt_tokens
    return graph, job.batch.profile.compiled_batch, lanes


__all__ = ["LEAD_S", "MAX_SPREAD", "RECENT", "SLICE_S", "EndWindows", "Window", "job_shape"]
