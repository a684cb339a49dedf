"""The mock's device memory (docs/runtime.md §8): a bounded window per chip, real bytes, device-clock stamps."""

from __future__ import annotations

import numpy as np
import pytest

from calctl.errors import ConfigError
from calctl.runtime.errors import DeviceBusy, DeviceLost, InvalidArgument
from calctl.runtime.memory import DeviceMemory, TransferDirection
from calctl.runtime.mock import FaultKind, FaultPlan, FaultRule, open_mock
from tests.unit.runtime.runtime_helpers import package, prefill_job

MIB = 1024**2


def test_bytes_written_to_a_chip_come_back_and_each_chip_has_its_own() -> None:
    with open_mock() as rt:
        assert isinstance(rt, DeviceMemory)
        base, size = rt.test_window(0)
        assert size == 64 * MIB
        a = np.random.default_rng(1).integers(0, 256, MIB, dtype=np.uint8)
        t = rt.write_mem(0, base, a)
        assert (t.chip, t.direction, t.bytes) == (0, TransferDirection.H2D, MIB)
        assert t.device_seconds == pytest.approx(5e-6 + MIB / 3e9, rel=0.01)  # latency + bytes / 3 GB/s
        out = np.empty_like(a)
        rt.read_mem(0, base, out)
        assert np.array_equal(out, a)
        rt.read_mem(1, base, out)
        assert not out.any()  # chip 1's window was never written


def test_transfers_queue_on_the_chip_engine_on_the_device_clock() -> None:
    with open_mock() as rt:
        base, _ = rt.test_window(0)
        data = np.zeros(4 * MIB, np.uint8)
        first, second = rt.write_mem(0, base, data), rt.write_mem(0, base, data)
        assert first.end_ns is not None and second.start_ns is not None
        assert second.start_ns >= first.end_ns  # one engine a direction: never two at once


@pytest.mark.parametrize(
    ("chip", "offset", "n", "error"),
    [(2, 0, 16, InvalidArgument), (0, -16, 16, InvalidArgument), (0, 64 * MIB - 8, 16, InvalidArgument)],
)
def test_outside_the_window_or_the_board_is_refused(chip: int, offset: int, n: int, error: type) -> None:
    with open_mock() as rt:
        base, _ = rt.test_window(0)
        with pytest.raises(error):
            rt.write_mem(chip, base + offset, np.zeros(n, np.uint8))


def test_no_transfer_while_configured_or_on_a_halted_chip() -> None:
    pkg = package("combined")
    plan = FaultPlan(rules=(FaultRule(kind=FaultKind.CCU_EXCEPTION, at=(1,), chip=1),))
    with open_mock(fault_plan=plan) as rt:
        base, _ = rt.test_window(1)
        rt.configure(rt.create_calbin(pkg))
        with pytest.raises(DeviceBusy, match="configured"):
            rt.write_mem(0, base, np.zeros(16, np.uint8))
        job = prefill_job(rt, pkg, "model-b")[0]
        rt.wait_any([job], 10)
        rt.reset_configuration()
        with pytest.raises(DeviceLost, match="chip 1 is faulted"):
            rt.write_mem(1, base, np.zeros(16, np.uint8))
        rt.write_mem(0, base, np.zeros(16, np.uint8))  # the other chip still transfers


def test_transfer_faults_slow_the_modelled_rate_and_are_logged() -> None:
    plan = FaultPlan(
        rules=(
            FaultRule(kind=FaultKind.SLOW_CHIP_TRANSFER, probability=1.0, chip=1, magnitude=0.5),
            FaultRule(kind=FaultKind.SLOW_LINK, at=(3,), magnitude=0.25),
        )
    )
    with open_mock(fault_plan=plan) as rt:
        base, _ = rt.test_window(0)
        data = np.zeros(8 * MIB, np.uint8)
        fast = rt.write_mem(0, base, data).device_seconds
        half = rt.write_mem(1, base, data).device_seconds
        slow_link = rt.write_mem(0, base, data).device_seconds  # the third transfer: the link at 1.25 GB/s
        assert fast is not None and half is not None and slow_link is not None
        assert 8 * MIB / half / 1e9 == pytest.approx(1.5, rel=0.01)
        assert 8 * MIB / slow_link / 1e9 == pytest.approx(1.25, rel=0.01)
        assert 8 * MIB / fast / 1e9 == pytest.approx(3.0, rel=0.01)
        assert [f.kind for f in rt.injected_faults()] == [FaultKind.SLOW_CHIP_TRANSFER, FaultKind.SLOW_LINK]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"kind": "slow_link", "job": 1}, "fires on transfers; use 'transfer', not 'job'"),
        ({"kind": "slow_link", "transfer": 1, "magnitude": 2}, r"rate kept, in \(0, 1\]"),
        ({"kind": "slow_chip_transfer", "probability": 1, "model": "model-a"}, "per transfer"),
        ({"kind": "ccu_exception", "job": 1, "magnitude": 0.5}, "magnitude applies only"),
        ({"kind": "stuck_bit", "probability": 1, "chip": 0}, "stuck_bit needs chip and address"),
        ({"kind": "stuck_bit", "probability": 1, "address": 64}, "stuck_bit needs chip and address"),
        ({"kind": "bit_flip", "probability": 1, "bit": 2}, "bit_flip flips a seeded bit"),
        ({"kind": "slow_link", "probability": 1, "address": 64}, "address applies only to stuck_bit and bit_flip"),
        ({"kind": "stuck_bit", "probability": 1, "chip": 0, "address": 64, "bit": 8}, "bit"),
    ],
)
def test_bad_transfer_fault_rules_are_refused(rule: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FaultPlan.from_document({"schema": "calctl-fault-plan/v1", "faults": [rule]}, source="plan.yaml")


def test_a_plan_rule_without_magnitude_takes_the_kind_default() -> None:
    doc = {"schema": "calctl-fault-plan/v1", "faults": [{"kind": "slow_chip_transfer", "transfer": 1}]}
    assert FaultPlan.from_document(doc).rules[0].magnitude == 0.5


def test_a_stuck_bit_reads_its_value_only_where_a_read_covers_it() -> None:
    plan = FaultPlan(
        rules=(FaultRule(kind=FaultKind.STUCK_BIT, probability=1.0, chip=0, address=0x4000010, bit=0, stuck_at=1),)
    )
    with open_mock(fault_plan=plan) as rt:
        base, _ = rt.test_window(0)
        rt.write_mem(0, base, np.zeros(64, np.uint8))
        out = np.empty(64, np.uint8)
        rt.read_mem(0, base, out)
        assert np.flatnonzero(out).tolist() == [0x10] and out[0x10] == 1
        rt.read_mem(0, base + 0x20, out[:16])  # a read that does not cover the address is untouched
        assert not out[:16].any()
        rt.write_mem(1, base, np.zeros(64, np.uint8))
        rt.read_mem(1, base, out)
        assert not out.any()  # the rule is chip 0's
