"""Progress of long work (#53 item 5): readable at 80 columns on a terminal, one line per cycle or minute in a log."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from calctl.cli import _output, _progress
from calctl.cli._progress import LongProgress, Plan, clock
from tests.waiting import wait_until

_LIVE = (
    "traffic, generation 3; requests 164 sent, 107 succeeded, 40 intended, 17 refused, 0 failed; "
    "0 violation(s); drift MiB chip0 +0 chip1 +0"
)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_in_a_log_one_line_per_cycle_and_one_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    monkeypatch.setattr(_output, "info", lines.append)
    now = _Clock()
    with LongProgress(Plan("soak", 100), now=now, is_terminal=False) as p:
        for _ in range(50):  # many updates inside one cycle: no line
            now.t += 0.25
            p.update(0, _LIVE)
        assert lines == []
        now.t += 60
        p.update(0, _LIVE)  # a minute without a finished cycle: a line saying it is alive
        assert len(lines) == 1 and "0/100 cycles" in lines[0] and "ETA -:--:--" in lines[0]
        now.t += 10
        p.update(1, _LIVE)
        assert len(lines) == 2 and lines[1].startswith("soak 1/100 cycles, 0:01:22 elapsed, ETA 2:16:08 | traffic")
        p.update(1, _LIVE)
        assert len(lines) == 2


def test_a_timed_run_counts_its_hours_and_its_eta_is_the_time_left() -> None:
    plan = Plan("soak", 24 * 3600, None)
    line = LongProgress(plan, is_terminal=False).line(3600.0, _LIVE, 3600.0)
    assert line.startswith("soak 1:00:00/24:00:00, 1:00:00 elapsed, ETA 23:00:00 | ")


def test_on_an_80_column_terminal_the_bar_eta_and_counts_are_whole_and_the_live_counters_wrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 100-120 columns the old single line was cut to `` 2 … traffic | gen 3 | …`` (no bar, no ETA)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None, legacy_windows=False)
    monkeypatch.setattr(_output, "stderr", console)
    with LongProgress(Plan("soak", 100), is_terminal=True) as p:
        p.update(37, _LIVE, elapsed_s=600.0)
        shown = p._progress.get_renderables()
        out = io.StringIO()
        Console(file=out, width=80, color_system=None).print(*shown)
    text = out.getvalue()
    bar_line = text.splitlines()[0]
    assert "37/100 cycles" in bar_line and "ETA" in bar_line and "━" in bar_line and "…" not in bar_line
    assert len(bar_line.rstrip()) <= 80
    rest = " ".join(line.strip() for line in text.splitlines()[1:])
    assert "164 sent, 107 succeeded, 40 intended, 17 refused, 0 failed" in rest and "…" not in text


def test_clock() -> None:
    assert clock(3725) == "1:02:05" and clock(None) == "-:--:--" and clock(float("nan")) == "-:--:--"
    assert _progress.BAR_WIDTH < 40


def test_a_heartbeat_says_in_a_log_that_work_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """#53 item 5: ``import gguf`` printed nothing for 1-3 minutes."""
    import time

    lines: list[str] = []
    monkeypatch.setattr(_output, "info", lines.append)
    with _progress.Heartbeat("import model.gguf", interval_s=0.05, is_terminal=False):
        wait_until(lambda: len(lines) >= 2, what="two heartbeat lines", timeout=30)
    assert len(lines) >= 2 and lines[0].startswith("import model.gguf: still working, 0:00:00 elapsed")
    settled = len(lines)
    time.sleep(0.2)
    assert len(lines) == settled  # it stops with the work


def test_accept_says_its_plan_and_estimate_before_it_starts(tmp_path: Path) -> None:
    from calctl.cli.accept_cmds import _plan_line
    from calctl.runners.acceptance.plan import AcceptConfig, Level
    from calctl.runners.device import DeviceSpec
    from calctl.signing.policy import TrustPolicy

    config = AcceptConfig(tmp_path, TrustPolicy(), DeviceSpec(), Level.QUICK, tmp_path)
    line = _plan_line(config)
    # the board first: the check at every level, the self-test (standard, long) and burn-in (long) where they run
    assert line.startswith("plan: device-check, validate, validate-replica, budget, ")
    assert "soak (3 cycles of 0.5 s traffic)" in line
    assert line.endswith("about 1–3 min on the mock (72 s measured on 2 cores)")
    only = AcceptConfig(tmp_path, TrustPolicy(), DeviceSpec(), Level.LONG, tmp_path, only=frozenset({"M3"}))
    assert _plan_line(only) == (
        "plan: device-check, selftest, burn-in (30 min), validate, batch; about 24 h: the soak alone runs 24 h"
    )
    shorter = AcceptConfig(tmp_path, TrustPolicy(), DeviceSpec(), Level.LONG, tmp_path, burnin_minutes=0.5)
    assert "burn-in (0.5 min)" in _plan_line(shorter)
