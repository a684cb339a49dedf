"""``Runtime.trace(since_ns=...)`` (calctl.runtime.bookkeeping): a job's record asks for the events submitted
since its own submission; the answer walks back from the newest event and must equal filtering the whole
history, whatever order the jobs finished in."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from calctl.runtime.bookkeeping import DeviceBookkeeping
from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.types import Engine, JobState


def _board(history: int) -> DeviceBookkeeping:
    board: DeviceBookkeeping = DeviceBookkeeping.__new__(DeviceBookkeeping)
    board._init_bookkeeping(threading.Lock(), history)
    return board


def _finish(board: DeviceBookkeeping, job_id: int, submit_ns: int, chips: tuple[int, ...]) -> None:
    job = SimpleNamespace(
        id=job_id, chips=chips, model="m", graph="g", engine=Engine.AUTO, generation=1, submit_ns=submit_ns
    )
    result = SimpleNamespace(
        start_ns=submit_ns, end_ns=submit_ns + 5, state=JobState.SUCCEEDED, status=RuntimeStatus.OK
    )
    board._trace_job(job, result, phases=())  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    submits=st.lists(st.integers(0, 1000), min_size=0, max_size=60),
    seed=st.integers(0, 2**16),
    history=st.integers(1, 80),
    since=st.integers(-5, 1005),
)
def test_a_window_is_the_events_submitted_since_it_in_history_order(
    submits: list[int], seed: int, history: int, since: int
) -> None:
    board = _board(history)
    order = list(enumerate(submits))
    random.Random(seed).shuffle(order)  # jobs finish in any order
    for job_id, submit in order:
        _finish(board, job_id, submit, (0, 1) if job_id % 3 == 0 else (job_id % 2,))
    everything = board.trace()
    # Whole jobs are kept, newest first, while their events fit in ``history``; the newest always stays.
    kept = 0
    for n in reversed([2 if j % 3 == 0 else 1 for j, _ in order]):
        if kept and kept + n > history:
            break
        kept += n
    assert len(everything) == kept
    assert board.trace(since_ns=since) == tuple(e for e in everything if e.submit_ns >= since)
