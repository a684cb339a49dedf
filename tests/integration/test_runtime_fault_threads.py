"""Fault plans under real concurrency: two threads drive the two chips of the mock board at once.

Moved here from tests/unit/runtime/test_mock_board.py: it starts threads against a running board.
Per-graph submit ordinals (not arrival order across threads) decide which submit a fault hits, so the
same plan and seed give the same faults and outputs however the threads interleave.
"""

from __future__ import annotations

import threading

import numpy as np

from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.mock import FaultKind, FaultPlan, open_mock
from tests.unit.runtime.runtime_helpers import package, prefill_job


def test_same_plan_and_seed_reproduce_the_same_faults() -> None:
    pkg = package("combined")
    plan = FaultPlan.from_document(
        {
            "schema": "calctl-fault-plan/v1",
            "seed": 11,
            "faults": [
                {"kind": "corrupt_output", "probability": 0.3, "graph": "model_a_prefill"},
                {"kind": "device_busy", "probability": 0.25, "model": "model-b"},
                {"kind": "kv_corruption", "job": [2, 5], "graph": "model_b_prefill"},
            ],
        }
    )

    def run(seed: int | None) -> tuple[list[tuple[int, FaultKind, int, str | None]], list[np.ndarray]]:
        logits = []
        with open_mock(fault_plan=plan, seed=seed, time_scale=0.0) as rt:
            rt.configure(rt.create_calbin(pkg))

            def drive(alias: str, out: list[np.ndarray]) -> None:
                for _ in range(12):
                    try:
                        job, seq, _, outputs = prefill_job(rt, pkg, alias)
                    except Exception as exc:  # injected DeviceBusy
                        assert getattr(exc, "status", None) == RuntimeStatus.DEVICE_BUSY
                        continue
                    rt.wait(job, 10)
                    out.append(outputs.read("logits"))
                    rt.kv.free(seq)

            # Two threads submitting to two chips at once: per-graph ordinals keep the draws stable.
            outs: dict[str, list[np.ndarray]] = {"model-a": [], "model-b": []}
            threads = [threading.Thread(target=drive, args=(a, outs[a])) for a in outs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            faults = sorted((f.rule_index, f.kind, f.ordinal, f.graph) for f in rt.injected_faults())
            logits = outs["model-a"] + outs["model-b"]
        return faults, logits

    faults1, logits1 = run(None)
    faults2, logits2 = run(None)
    assert faults1 == faults2
    assert all(np.array_equal(x, y) for x, y in zip(logits1, logits2, strict=True)) and len(logits1) == len(logits2)
    kinds = {f[1] for f in faults1}
    assert kinds == {FaultKind.CORRUPT_OUTPUT, FaultKind.DEVICE_BUSY, FaultKind.KV_CORRUPTION}
    # Exact ordinals fire on the 2nd/5th matching submit, unless an injected busy refused that submit.
    assert 2 in [f[2] for f in faults1 if f[1] is FaultKind.KV_CORRUPTION]
    assert {f[2] for f in faults1 if f[1] is FaultKind.KV_CORRUPTION} <= {2, 5}
    faults3, _ = run(12)
    assert faults3 != faults1  # another seed draws differently
