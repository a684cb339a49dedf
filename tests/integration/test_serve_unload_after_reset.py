"""Unloading after a board reset: the configuration is already gone, which is expected, not a second fault.

A board reset drops the calbin with everything else, so the unload's ``reset_configuration`` finds nothing
configured. That must be reported as expected (no warning, no second board reset), since the fault-isolation
scenario used to print "reset_configuration failed (no calbin is configured); resetting the board" with no
word on whether that was expected.
"""

from __future__ import annotations

import logging

import pytest

from tests.integration.serve_harness import serving


def test_unload_after_a_board_reset_is_quiet_and_resets_nothing_more(caplog: pytest.LogCaptureFixture) -> None:
    with serving(time_scale=0.05) as s:
        resets: list[str] = []
        real_reset = s.rt.reset

        def counting_reset(scope: object = "chip", chip: int | None = None) -> None:
            resets.append(str(getattr(scope, "value", scope)))
            real_reset(scope, chip)

        s.rt.reset("board")
        s.rt.reset = counting_reset
        with caplog.at_level(logging.INFO, logger="calctl"):
            result = s.supervisor.unload()
        assert result.ok is True, result
        assert resets == [], f"unload reset the board again: {resets}"
        messages = [r.getMessage() for r in caplog.records]
        assert not [m for m in messages if "reset_configuration failed" in m], messages
        assert any("a board reset dropped it" in m for m in messages), messages
