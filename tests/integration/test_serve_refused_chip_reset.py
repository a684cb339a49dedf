"""A refused chip reset becomes a board reset only after both aliases left service (issue 49, 001 §11.2/§11.3).

``allow_session_reset: true``, a runtime that grants board resets only (CalRT 0.7.6), a CCU fault on model A.
The chip reset is refused, so the board is reset; before that call model B must be Draining, then Recovering
(001 §11.2: stop both admissions, drain both, then reset). The log used to read "...; draining every alias,
then resetting the board" one line *before* "model model-b -> Draining", so an operator (and the issue's
tester) read the board reset as coming first. These tests pin the order of what happened (the states at the
reset call) and of what the log says (the board reset's line after B's Draining and Recovering).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import httpx
import pytest

from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import ResetScope
from tests.integration.serve_harness import serving
from tests.waiting import wait_until


@pytest.mark.parametrize("refusal", ["board-only runtime", "board-scope fault"])
def test_b_is_draining_then_recovering_before_the_board_reset_in_fact_and_in_the_log(
    refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    board_only = refusal == "board-only runtime"
    scopes = {"reset_scopes": (ResetScope.BOARD,)} if board_only else {}
    scope = ResetScope.CHIP if board_only else ResetScope.BOARD  # the fault's own scope: a chip reset refuses it
    with serving(time_scale=0.05, runtime_options=scopes) as served:
        sup = served.supervisor
        sup.options = dataclasses.replace(sup.options, allow_session_reset=True)
        order: list[str] = []
        real_reset = served.rt.reset

        def reset(kind: Any = "chip", chip: Any = None) -> None:
            name = str(getattr(kind, "value", kind))
            if name == "board":
                order.append("reset board: " + ", ".join(f"{a} {w.state.value}" for a, w in sup.cores.items()))
            real_reset(kind, chip)

        served.rt.reset = reset
        served.rt.arm_fault(FaultRule(FaultKind.CCU_EXCEPTION, at=(2,), graph="model_a_decode", reset_scope=scope))
        body = {"model": "model-a", "prompt": "x", "max_tokens": 6, "temperature": 0}
        with caplog.at_level(logging.INFO, logger="calctl"):
            httpx.post(f"{served.v1}/completions", json=body, timeout=60)
            recs = wait_until(lambda: list(sup.recoveries), what="the recovery of A's fault", timeout=60)
            wait_until(lambda: all(w.is_ready() for w in sup.cores.values()), what="both aliases Ready", timeout=60)
        assert [(r.scope, r.affected_aliases, r.ok) for r in recs] == [("board", ("model-a", "model-b"), True)], recs
        # In fact: at the reset call both aliases were out of service.
        assert order == ["reset board: model-a Recovering, model-b Recovering"], order
        # In the log: B's Draining and Recovering, then the line of the board reset.
        lines = [r.getMessage() for r in caplog.records if r.name == "calctl.serve"]
        b_draining = lines.index(next(m for m in lines if m.startswith("model model-b -> Draining")))
        b_recovering = lines.index(next(m for m in lines if m.startswith("model model-b -> Recovering")))
        board = [i for i, m in enumerate(lines) if m.startswith("board reset for the recovery of model-a")]
        assert len(board) == 1 and b_draining < b_recovering < board[0], lines
        assert "resetting the board" not in "\n".join(lines[:b_draining]), lines[:b_draining]
