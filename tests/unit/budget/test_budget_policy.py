"""001 §8.2 thresholds: exact arithmetic and a verdict that flips one byte past the limit or the guard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from calctl.budget.builders import plan_from_config
from calctl.budget.plan import (
    Estimates,
    WorkspaceOverride,
    evaluate,
)
from calctl.budget.policy import BudgetPolicy, BudgetVerdict
from calctl.budget.shape import ModelShape
from calctl.errors import UsageError

GIB = 1024**3
DRAM_16 = 16 * GIB


def test_limit_and_guard_arithmetic_is_exact() -> None:
    p = BudgetPolicy()
    assert p.limit_bytes(DRAM_16) == 13_743_895_347  # floor(0.8 x 17179869184 = 13743895347.2)
    assert p.guard_bytes(DRAM_16) == 2_576_980_378  # ceil(0.15 x 17179869184 = 2576980377.6)
    assert p.usable_bytes(DRAM_16) == 13_743_895_347  # the 80 % limit binds on a 16 GiB chip
    assert p.guard_bytes(4 * GIB) == GIB  # 15 % of 4 GiB is 0.6 GiB: the 1 GiB floor binds
    assert p.usable_bytes(4 * GIB) == 3 * GIB  # min(3.2 GiB limit, 4 GiB - 1 GiB guard)


def test_verdict_flips_one_byte_over_the_limit() -> None:
    p = BudgetPolicy()
    at = p.limit_bytes(DRAM_16)
    assert p.judge(at, DRAM_16).verdict is BudgetVerdict.GO
    over = p.judge(at + 1, DRAM_16)
    assert over.verdict is BudgetVerdict.NO_GO
    assert len(over.reasons) == 1 and "> limit" in over.reasons[0]


def test_verdict_flips_one_byte_into_the_guard() -> None:
    p = BudgetPolicy()  # on 4 GiB the guard (1 GiB) binds before the limit (3.2 GiB)
    at = 4 * GIB - GIB
    assert p.judge(at, 4 * GIB).verdict is BudgetVerdict.GO
    over = p.judge(at + 1, 4 * GIB)
    assert over.verdict is BudgetVerdict.NO_GO
    assert len(over.reasons) == 1 and "< guard" in over.reasons[0]


def test_guard_fraction_binds_when_the_limit_allows_everything() -> None:
    p = BudgetPolicy(limit=1.0)
    at = DRAM_16 - p.guard_bytes(DRAM_16)
    assert p.judge(at, DRAM_16).verdict is BudgetVerdict.GO
    assert p.judge(at + 1, DRAM_16).verdict is BudgetVerdict.NO_GO


def test_go_explains_both_checks() -> None:
    reasons = BudgetPolicy().judge(GIB, DRAM_16).reasons
    assert len(reasons) == 2
    assert "<= limit 12.800 GiB" in reasons[0]
    assert ">= guard 2.400 GiB" in reasons[1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0.0},
        {"limit": 1.2},
        {"limit": float("nan")},
        {"guard_fraction": 1.0},
        {"guard_fraction": -0.1},
        {"guard_min_bytes": -1},
    ],
)
def test_policy_rejects_out_of_range_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        BudgetPolicy(**kwargs)


# The same flips through a whole chip evaluation: with fragmentation set to 0, static is
# linear in an explicit workspace, so a workspace can put static exactly on the threshold.
NO_FRAGMENTATION = Estimates(fragmentation=0.0)


def _static_with_workspace(
    shape: ModelShape, dram: int, workspace: int, policy: BudgetPolicy
) -> tuple[int, BudgetVerdict]:
    plan = plan_from_config(shape, chip_dram_bytes=dram, workspace=WorkspaceOverride(peak_bytes=workspace))
    b = evaluate(plan.loads[0], policy, NO_FRAGMENTATION, context=4096, sequences=1)
    return b.static_bytes, b.verdict


@pytest.mark.parametrize(("dram", "binding"), [(DRAM_16, "limit"), (4 * GIB, "guard")])
def test_chip_verdict_flips_exactly_at_each_threshold(
    hf_shape: Callable[[str], ModelShape], dram: int, binding: str
) -> None:
    shape = hf_shape("Llama-3.2-1B")
    policy = BudgetPolicy()
    base, _ = _static_with_workspace(shape, dram, 0, policy)
    usable = policy.usable_bytes(dram)
    threshold = policy.limit_bytes(dram) if binding == "limit" else dram - policy.guard_bytes(dram)
    assert usable == threshold  # the case really exercises the threshold it names
    at, verdict = _static_with_workspace(shape, dram, usable - base, policy)
    assert (at, verdict) == (usable, BudgetVerdict.GO)
    over, verdict = _static_with_workspace(shape, dram, usable - base + 1, policy)
    assert (over, verdict) == (usable + 1, BudgetVerdict.NO_GO)


def test_each_chip_is_judged_on_its_own_dram(hf_shape: Callable[[str], ModelShape]) -> None:
    # Two chips of 8 GiB are not one chip of 16 GiB (001 §8.2): a load that needs ~10 GiB
    # static fails on each 8 GiB chip even though the board total would hold it.
    plan = plan_from_config(
        hf_shape("Llama-3.2-1B"), chips=1, chip_dram_bytes=8 * GIB, workspace=WorkspaceOverride(peak_bytes=6 * GIB)
    )
    load = plan.loads[0]
    budget = evaluate(load, BudgetPolicy(), context=4096, sequences=1)
    assert budget.verdict is BudgetVerdict.NO_GO
    assert budget.static_bytes < 16 * GIB * 0.8
    assert (
        evaluate(replace(load, dram_bytes=16 * GIB), BudgetPolicy(), context=4096, sequences=1).verdict
        is BudgetVerdict.GO
    )
