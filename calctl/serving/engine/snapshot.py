"""One alias's 000 §16 gauges at scrape time, read from its scheduler on the engine core's thread."""

from __future__ import annotations

from calctl.serving.config import DEFAULT_TENANT
from calctl.serving.core.ids import TenantId
from calctl.serving.core.request import RequestState
from calctl.serving.core.scheduler import Scheduler
from calctl.serving.engine.metrics import ModelSnapshot, TenantSnapshot


def model_snapshot(
    alias: str, sched: Scheduler, now: float, *, state: str, generation: int | None, executor_mode: str
) -> ModelSnapshot:
    """The scheduler's queues and lanes, plus what one pass over the live requests gives (never per token):
    the oldest wait of each queue class, the longest wait for a KV lane, the KV tokens written, and the
    virtual lag and quota use of each configured tenant and of ``default`` (keyless requests, under the
    default policy): tenant labels come from configuration, never from requests."""
    st = sched.stats()
    classify = sched.prefill.thresholds.classify
    oldest = {"short": 0.0, "medium": 0.0, "long": 0.0, "decode": 0.0}
    lane_wait = 0.0
    for seq in sched.registry:
        if seq.state is RequestState.PREFILL_READY:
            q = classify(seq.prompt_tokens).value.replace("prefill_", "")
        elif seq.state is RequestState.DECODE_READY:
            q = "decode"
        elif seq.state is RequestState.WAITING_ADMISSION:
            lane_wait = max(lane_wait, now - seq.arrived_at)
            continue
        else:
            continue
        oldest[q] = max(oldest[q], now - seq.state_since)
    adm = sched.admission
    ast = adm.stats()
    tenants = [
        TenantSnapshot(
            str(t),
            adm.fairness.virtual_lag(t),
            ast.active_by_tenant.get(t, 0),
            p.max_active_sequences,
            ast.waiting_tokens_by_tenant.get(t, 0),
            p.max_waiting_tokens,
        )
        for t, p in {TenantId(DEFAULT_TENANT): adm.policy.default_tenant, **adm.policy.tenants}.items()
    ]
    queues = {k.value.replace("prefill_", ""): v for k, v in st.prefill_depth.items()}
    queues["decode"] = st.decode_ready
    return ModelSnapshot(
        alias=alias,
        state=state,
        generation=generation,
        queues=queues,
        waiting_requests=st.waiting_requests,
        waiting_prompt_tokens=st.waiting_prompt_tokens,
        kv_lanes={k.value: v for k, v in st.kv_by_state.items()},
        kv_reserved_tokens=st.kv_reserved_tokens,
        inflight_jobs=st.inflight_jobs,
        quarantined_jobs=st.quarantined_jobs,
        executor_mode=executor_mode,
        oldest_wait=oldest,
        lane_wait_s=lane_wait,
        kv_used_tokens=sched.kv.stats().committed_tokens,
        tenants=tenants,
    )


__all__ = ["model_snapshot"]
