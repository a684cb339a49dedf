"""The serving audit (issue 50): a board that goes wrong while serving leaves service instead of answering wrong text.

The engine serves the bundled combined sample on the mock; a fault armed after Ready makes model-a's decode jobs
"succeed" with perturbed logits, which only a known answer can tell.
"""

from __future__ import annotations

import pytest

from calctl.compiler.bundled import bundled_package
from calctl.runners.device import DeviceSpec
from calctl.runners.serving_stack import ServingStack
from calctl.runtime.interface import FaultInjecting
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.serving.core.admission import ModelState
from calctl.serving.engine import SupervisorOptions
from calctl.serving.engine.audit import AUDIT_TENANT, BoardAudit
from calctl.signing.policy import make_policy
from tests.waiting import wait_until


def _audit_counts(stack: ServingStack) -> dict[tuple[str, str], float]:
    out = {}
    for metric in stack.sup.metrics.registry.collect():
        for smp in metric.samples:
            if smp.name == "calctl_audit_probes_total":
                out[(smp.labels["model"], smp.labels["result"])] = smp.value
    return out


def test_a_wrong_answer_takes_the_alias_out_of_service_through_a_recovery() -> None:
    trust = make_policy(None, False, trust_test_key=True)
    with (
        DeviceSpec().open() as rt,
        ServingStack(
            rt, trust=trust, name="audit", options=SupervisorOptions(warmup_iterations=1, drain_deadline_s=5.0)
        ) as stack,
    ):
        stack.start(bundled_package("combined"))
        audit = BoardAudit(stack.engine, 60.0)
        healthy = audit.audit_once()
        assert [(r.alias, r.result) for r in healthy] == [("model-a", "pass"), ("model-b", "pass")]

        assert isinstance(rt, FaultInjecting)
        rt.arm_fault(FaultRule(FaultKind.CORRUPT_OUTPUT, probability=1.0, graph="model_a_decode", magnitude=50.0))
        results = {r.alias: r for r in audit.audit_once()}
        assert results["model-a"].result == "fail", results
        assert "model-a answered its golden prompt wrong at output token" in results["model-a"].detail
        # model-b: probed before the board reset took it away (pass), or not probed at all while it recovers
        assert results.get("model-b") is None or results["model-b"].result in ("pass", "skipped"), results
        # 001 §11.3: out of service at once, then a recovery whose golden fails while the fault stays: Failed.
        core_a = stack.core("model-a")
        assert not core_a.is_ready()
        wait_until(
            lambda: core_a.state is ModelState.FAILED, what="model-a Failed after its recovery's golden", timeout=120
        )
        # The default recovery resets the board (001 §11.3): model-b goes through it too, and the recovery's
        # outcome (here Failed: model-a's golden fails after the reset with the fault still armed) is its own.
        core_b = stack.core("model-b")
        wait_until(lambda: core_b.state in (ModelState.READY, ModelState.FAILED), what="model-b settled", timeout=120)
        rec = wait_until(lambda: stack.sup.recoveries[-1:], what="the recovery record", timeout=60)[0]
        assert rec.alias == "model-a" and rec.reason == "fault" and not rec.ok, rec
        assert "golden" in stack.sup.failures["model-a"], stack.sup.failures
        counts = _audit_counts(stack)
        assert counts[("model-a", "pass")] == 1 and counts[("model-a", "fail")] == 1
        assert counts[("model-b", "pass")] >= 1 and ("model-b", "fail") not in counts


def test_the_audit_thread_probes_at_its_interval_and_stops() -> None:
    trust = make_policy(None, False, trust_test_key=True)
    with (
        DeviceSpec().open() as rt,
        ServingStack(rt, trust=trust, name="audit", options=SupervisorOptions(warmup_iterations=1)) as stack,
    ):
        stack.start(bundled_package("combined"))
        audit = BoardAudit(stack.engine, 0.2)
        audit.start()
        try:
            wait_until(
                lambda: _audit_counts(stack).get(("model-b", "pass"), 0) >= 2, what="two audit rounds", timeout=60
            )
        finally:
            audit.stop()
        assert not audit._thread.is_alive()
        assert all(result == "pass" for (_, result) in _audit_counts(stack))
    assert AUDIT_TENANT == "calctl-audit"


def test_a_zero_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="expected > 0"):
        BoardAudit(None, 0)  # type: ignore[arg-type]
