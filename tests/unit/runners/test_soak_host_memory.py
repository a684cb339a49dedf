"""The soak's host-memory verdict by trend (calctl/runners/soak/host_memory.py, issue 53 item 4).

A fixed limit from cycle 1 failed a healthy 100-cycle soak: the runtime's bounded history of finished jobs
filled (~85 MiB) and was counted as a leak. The verdict is now the slope of VmRSS over the cycles after the
warm-up (until the history is full), with its 95 % interval; these series are what a healthy process and a
leaking one look like, with the noise and the steps of a real allocator.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from calctl.runners.soak import host_memory

MIB = 1024**2
KIB = 1024


def _series(cycles: int, *, fill_until: int, per_cycle: float, seed: int = 0) -> list[tuple[int, int | None]]:
    """VmRSS after each unload: 150 MiB, +300 KiB a cycle while a cache fills, then ``per_cycle``; 2 MiB of noise
    and an arena grown by 8 MiB once at a random cycle."""
    rng = random.Random(seed)
    step_at = rng.randrange(min(fill_until + 1, cycles), cycles + 1)
    out: list[tuple[int, int | None]] = []
    for c in range(1, cycles + 1):
        fill = 300 * KIB * min(c, fill_until)
        grown = per_cycle * max(0, c - fill_until)
        step = 8 * MIB if c >= step_at else 0
        out.append((c, int(150 * MIB + fill + grown + step + rng.uniform(-1, 1) * MIB)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_a_healthy_process_whose_cache_fills_passes_and_a_256_kib_leak_fails(seed: int) -> None:
    healthy = host_memory.judge(_series(500, fill_until=120, per_cycle=0, seed=seed), caches_full_at=120)
    assert healthy.method == "trend" and healthy.ok, healthy.words()
    assert healthy.warmup_cycles == 120 and "job history filled, at cycle 120" in healthy.warmup_reason
    leak = host_memory.judge(_series(500, fill_until=120, per_cycle=256 * KIB, seed=seed), caches_full_at=120)
    assert leak.method == "trend" and not leak.ok, leak.words()
    # The 8 MiB step tilts the line by up to ~1.5 x 8 MiB / 380 cycles: the slope, not its interval, is near 256 KiB.
    assert leak.trend is not None and abs(leak.trend.slope - 256 * KIB) < host_memory.SLOPE_LIMIT_BYTES
    assert leak.trend.first_cycle == 121 and leak.trend.last_cycle == 500


def test_judged_from_cycle_1_the_filling_cache_would_have_been_a_leak() -> None:
    """What the fixed limit and an unexcluded warm-up get wrong: the same healthy series, warm-up ignored."""
    series = _series(500, fill_until=300, per_cycle=0)
    assert not host_memory.judge(series, caches_full_at=1).ok  # the filling counted: a false FAIL
    assert host_memory.judge(series, caches_full_at=300).ok


def test_the_fit_is_least_squares_with_a_students_t_interval() -> None:
    rng = np.random.default_rng(1)
    x = np.arange(10, 60)
    y = 1000.0 * x + rng.normal(0, 5000, x.size)
    t = host_memory.fit(list(zip(x.tolist(), y.astype(int).tolist(), strict=True)))
    slope, intercept = np.polyfit(x, y.astype(int), 1)
    resid = y.astype(int) - (slope * x + intercept)
    se = np.sqrt(resid @ resid / (x.size - 2) / ((x - x.mean()) ** 2).sum())
    assert t.slope == pytest.approx(slope) and t.high - t.slope == pytest.approx(host_memory.t95(48) * se)
    assert host_memory.t95(48) == 2.042 and host_memory.t95(500) == 1.96 and host_memory.t95(1) == 12.706
    with pytest.raises(ValueError, match="3 or more samples"):
        host_memory.fit([(1, 5), (1, 6), (1, 7)])


def test_a_short_run_uses_the_fixed_limit_and_says_so() -> None:
    v = host_memory.judge(_series(15, fill_until=5, per_cycle=0), caches_full_at=5)
    assert v.method == "fixed limit" and v.ok and v.trend is None
    assert "a trend needs 20 cycles after the warm-up of 5" in v.words()
    doc = v.document()
    assert doc["method"] == "fixed limit" and doc["warmup_cycles"] == 5 and doc["fixed_limit_bytes"] == 64 * MIB


def test_without_a_history_report_the_warm_up_is_the_first_three_cycles() -> None:
    v = host_memory.judge(_series(60, fill_until=1, per_cycle=0), caches_full_at=None, reported=False)
    assert v.method == "trend" and v.warmup_cycles == 3 and "does not report its job history" in v.warmup_reason
    assert v.trend is not None and v.trend.first_cycle == 4 and v.ok


def test_a_history_still_filling_is_no_trend_the_fixed_limit_judges() -> None:
    """Cycles 1..100 of a cache filling at 300 KiB a cycle: a trend would call it a leak; it is not full yet."""
    v = host_memory.judge(_series(100, fill_until=400, per_cycle=0), caches_full_at=None)
    assert v.method == "fixed limit" and v.ok and "still filling after 100 cycle(s)" in v.words()
