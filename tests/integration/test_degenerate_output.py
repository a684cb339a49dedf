"""A decode job whose logits are degenerate (a lane's row all 0.0) is a fault, like non-finite logits: the
request ends with an error, never with text sampled from that row (issue #55: a kernel race once left a
hidden state that overflowed, the logits came out all zero and the server answered 200 with wrong text)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from calctl.package.model import GraphKind
from calctl.runtime.mock import compute
from tests.integration.executor_harness import GOLDEN, executor_engine


def test_a_decode_job_with_an_all_zero_logits_row_ends_its_request_with_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = compute.run_graph
    armed = threading.Event()
    zeroed: list[int] = []

    def run_graph(model: Any, kind: GraphKind, inputs: Any, outputs: Any, caches: Any) -> None:
        real(model, kind, inputs, outputs, caches)
        if kind is GraphKind.DECODE and armed.is_set() and not zeroed:
            outputs.device_view("logits")[:] = 0.0  # what the overflowed hidden state's final norm gave
            zeroed.append(1)

    monkeypatch.setattr(compute, "run_graph", run_graph)
    with executor_engine(time_scale=0.0) as h:
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(1, tag="warm"))
        armed.set()
        (out,) = h.run(1, tag="zeroed")
        assert zeroed, "no decode job ran after arming"
        assert not out.ok and out.error is not None and "degenerate logits (lane 0" in out.error, out
        assert out.delivered_right()  # every token it did deliver was the right one; token 0 never was
        assert len(out.tokens) < len(GOLDEN)
        downgrades = h.worker.downgrades()
        assert [d.reason.value for d in downgrades] == ["output_crosstalk"], downgrades
