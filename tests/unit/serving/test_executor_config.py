"""``executor`` in calculet-scheduler/v1 (000 §15) and the core's in-flight limit (000 §14: downgrades drain)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from calctl.serving.config import (
    ConfigFieldError,
    DowngradePolicy,
    ExecutorMode,
    default_scheduler_config,
    parse_scheduler_config,
)
from tests.unit.serving.serving_helpers import FakeClock, make_device

BASE = """\
schema: calculet-scheduler/v1
model_alias: model-a
admission: {max_waiting_requests: 128, max_waiting_prompt_tokens: 262144, deadline_default_ms: 120000}
queues: {decode_weight: 8, short_prefill_weight: 4, medium_prefill_weight: 2, long_prefill_weight: 1,
         short_prefill_max_tokens: 512, medium_prefill_max_tokens: 4096}
batch: {profiles: [1], batching_window_us: 0}
recovery: {max_resets_per_10min: 2, restart_on_unknown_dma: true}
"""


def parse(executor: dict[str, Any]) -> Any:
    doc = yaml.safe_load(BASE)
    doc["executor"] = executor
    return parse_scheduler_config(doc, source="s.yaml")


def test_000_s15_block_means_sync_and_two_in_flight_means_pingpong() -> None:
    assert parse({"max_inflight": 1, "fixed_engine": False}).executor.effective_mode is ExecutorMode.SYNC
    assert parse({"max_inflight": 2, "fixed_engine": False}).executor.effective_mode is ExecutorMode.PINGPONG
    assert default_scheduler_config("m").executor.effective_mode is ExecutorMode.SYNC


def test_explicit_mode_and_downgrade_block() -> None:
    e = parse(
        {
            "max_inflight": 2,
            "fixed_engine": False,
            "mode": "async",
            "downgrade": {
                "to": "sync",
                "p99_regression": 0.1,
                "p99_baseline_ms": 12.5,
                "p99_window": 100,
                "p99_min_samples": 20,
                "consecutive_busy": 5,
                "consecutive_timeouts": 2,
                "pending_grace_ms": 500,
            },
        }
    ).executor
    assert (
        e.effective_mode is ExecutorMode.ASYNC and e.max_inflight == 2
    )  # async now, ping/pong allowed for the operator
    assert e.downgrade == DowngradePolicy(ExecutorMode.SYNC, 0.1, 0.0125, 100, 20, 5, 2, 0.5)
    assert parse({"max_inflight": 1, "fixed_engine": True}).executor.downgrade == DowngradePolicy()


@pytest.mark.parametrize(
    "executor, where, text",
    [
        ({"max_inflight": 1, "fixed_engine": False, "mode": "pingpong"}, "/executor/mode", "needs max_inflight 2"),
        ({"max_inflight": 2, "fixed_engine": True}, "/executor/fixed_engine", "cannot use one fixed engine"),
        (
            {"max_inflight": 2, "fixed_engine": False, "downgrade": {"p99_window": 20, "p99_min_samples": 30}},
            "/executor/downgrade/p99_min_samples",
            "exceeds p99_window",
        ),
        ({"max_inflight": 2, "fixed_engine": False, "downgrade": {"to": "pingpong"}}, "/executor/downgrade/to", ""),
        ({"max_inflight": 2, "fixed_engine": False, "mode": "batch"}, "/executor/mode", ""),
        (
            {"max_inflight": 2, "fixed_engine": False, "downgrade": {"consecutive_busy": 0}},
            "/executor/downgrade/consecutive_busy",
            "",
        ),
        (
            {"max_inflight": 2, "fixed_engine": False, "downgrade": {"auto_reenable": True}},
            "/executor/downgrade/auto_reenable",
            "unknown field",
        ),
    ],
)
def test_bad_executor_blocks_name_the_field(executor: dict[str, Any], where: str, text: str) -> None:
    with pytest.raises(ConfigFieldError) as exc:
        parse(executor)
    assert where in exc.value.fields, exc.value.problems
    assert text in str(exc.value)


def test_lowering_the_inflight_limit_drains_before_handing_out_more(clock: FakeClock) -> None:
    dev = make_device(clock, max_inflight_jobs=2)
    for rid in ("a", "b", "c"):
        dev.add(rid, max_tokens=8)
    first = dev.sched.schedule(clock.now).jobs
    assert len(first) == 2  # two in flight
    dev.sched.set_inflight_limit(1)  # the downgrade: new jobs see it, the two in flight drain
    assert dev.sched.schedule(clock.now).jobs == ()
    dev.update(dev.outcome(first[0]), clock.now)
    assert dev.sched.schedule(clock.now).jobs == ()  # one still in flight: the limit is 1
    dev.update(dev.outcome(first[1]), clock.now)
    nxt = dev.sched.schedule(clock.now).jobs
    assert len(nxt) == 1
    dev.sched.check_invariants()
    dev.sched.set_inflight_limit(2)  # the operator re-enables ping/pong
    assert len(dev.sched.schedule(clock.now).jobs) == 1 and dev.sched.inflight_jobs == 2
    dev.sched.set_inflight_limit(5)
    assert dev.sched.inflight_limit == 2  # never above the configured max_inflight
