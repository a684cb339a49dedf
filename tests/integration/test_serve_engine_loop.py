"""The engine core's loop (issue 15 item 1): one thread per alias owns its scheduler; a bug inside the loop fails
the requests it held and the alias, logged once with the traceback, and is never retried in a loop."""

from __future__ import annotations

import logging
import threading

import pytest

from calctl.serving.config import ExecutorMode
from calctl.serving.protocol import EngineRejection, RejectCode
from tests.integration.executor_harness import ALIAS, GOLDEN, _gather, executor_engine
from tests.waiting import wait_until


@pytest.mark.parametrize("mode", list(ExecutorMode))
def test_only_the_core_thread_calls_the_scheduler(mode: ExecutorMode) -> None:
    with executor_engine(mode, time_scale=0.5) as h:
        core = h.worker
        sched = core._sched
        callers: set[str] = set()
        for name in ("arrive", "submit", "cancel", "stop", "schedule", "update_from_output", "drain_events"):
            real = getattr(sched, name)

            def spy(*a, _real=real, **kw):
                callers.add(threading.current_thread().name)
                return _real(*a, **kw)

            setattr(sched, name, spy)
        outs = h.run(4)
        assert all(o.ok and o.tokens == GOLDEN for o in outs)
        assert callers == {f"engine-{ALIAS}"}, callers


def test_a_bug_in_the_loop_fails_its_requests_and_the_alias_once(caplog: pytest.LogCaptureFixture) -> None:
    with executor_engine(ExecutorMode.ASYNC, time_scale=2.0) as h:
        core = h.worker
        real = core._sched.update_from_output
        calls = {"n": 0}

        def buggy(outcome, now):
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyError("a bug in the engine loop")
            return real(outcome, now)

        core._sched.update_from_output = buggy  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="calctl.serve"):
            outs = h.run(2)
        # Every request the core held ended, none hangs: an error after its tokens, or a 503 before any.
        assert all(o.finish == "error" or o.rejected == RejectCode.UNAVAILABLE.value for o in outs), outs
        assert any(o.error and "internal error in the engine loop" in o.error for o in outs), outs
        assert core.failed is not None and "KeyError" in core.failed
        assert core.state.value == "Failed" and not core.is_ready()
        wait_until(  # the loop ended; nothing retries it
            lambda: not core._thread.is_alive(), what="the engine loop's thread to end", timeout=5, interval=0.01
        )
        tracebacks = [r for r in caplog.records if r.exc_info and "engine loop" in r.getMessage()]
        assert len(tracebacks) == 1, [r.getMessage() for r in caplog.records]
        assert calls["n"] == 3  # nothing ran the broken step again
        # New requests are refused with a 503 at once, not queued for a loop that is gone.
        with pytest.raises(EngineRejection) as exc:
            h.engine.submit_threadsafe(h.request("late"), h.loop.loop)
        assert exc.value.code is RejectCode.UNAVAILABLE
        assert core.live_requests() == 0 and core.drained()


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1, 0])
def test_any_64_bit_seed_is_served_and_a_negative_one_does_not_kill_the_alias(seed: int) -> None:
    # Hostile test of issue 19: `"seed": -1` from any client crashed the engine loop (numpy refuses negative
    # seeds), failed the alias for good and left that request hanging.
    import dataclasses

    from calctl.serving.protocol import SamplingParams

    with executor_engine(ExecutorMode.ASYNC) as h:
        reqs = [
            dataclasses.replace(h.request(f"s{i}"), sampling=SamplingParams(temperature=1.0, seed=seed)) for i in (0, 1)
        ]
        outs = h.loop.submit(_gather(h.engine, reqs)).result(30)
        assert all(o.ok for o in outs), outs
        assert outs[0].tokens == outs[1].tokens  # the same seed samples the same tokens
        assert h.worker.failed is None and h.worker.is_ready()


def test_an_arrival_the_loop_cannot_take_is_refused_not_left_hanging() -> None:
    # The arrival that crashes the loop had no entry in the core's requests yet, so nothing ended its stream.
    with executor_engine(ExecutorMode.ASYNC) as h:
        core = h.worker

        def buggy(*a, **kw):
            raise ValueError("a bug while admitting")

        core._sched.arrive = buggy  # type: ignore[method-assign]
        outs = h.loop.submit(_gather(h.engine, [h.request("doomed")])).result(30)
        assert outs[0].rejected == RejectCode.UNAVAILABLE.value, outs
        failed = wait_until(lambda: core.failed, what="the core to record its failure")  # set after the refusal
        assert "ValueError" in failed
