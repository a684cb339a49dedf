"""000 §16 metrics on a running mock server: queue oldest wait, batch fill/wait, KV used tokens, lane wait,
free latency, WFQ virtual lag, starvation events, tenant quotas and recovery time, scraped from ``/metrics``
after real traffic and one injected fault (a board reset, 001 §11.3)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.serve_harness import COMBINED, golden, serving
from tests.waiting import wait_until

A_JOB = 60  # past the 16 golden + 8 warm-up decode jobs of model_a_decode: falls in serving traffic
ALIASES = ("model-a", "model-b")
TENANTS = ("default", "batch")  # configured; "batch" never sends a request and still shows


def _files(tmp: Path) -> tuple[Path, Path]:
    plan = tmp / "faults.yaml"
    plan.write_text(
        textwrap.dedent(f"""\
        schema: calctl-fault-plan/v1
        seed: 3
        faults:
          - {{kind: ccu_exception, job: {A_JOB}, graph: model_a_decode, reset_scope: chip}}
        """)
    )
    sched = (
        ", scheduler: {admission: {max_waiting_requests: 64, max_waiting_prompt_tokens: 262144,"
        " deadline_default_ms: 120000}, queues: {decode_weight: 8, short_prefill_weight: 4,"
        " medium_prefill_weight: 2, long_prefill_weight: 1, short_prefill_max_tokens: 512,"
        " medium_prefill_max_tokens: 4096}, batch: {profiles: [1], batching_window_us: 0},"
        " executor: {max_inflight: 1, fixed_engine: false},"
        " recovery: {max_resets_per_10min: 2, restart_on_unknown_dma: true},"
        " tenants: {default: {weight: 1, max_active_sequences: 8}, batch: {weight: 2, max_waiting_tokens: 4096}}}"
    )
    models = [
        f"  - {{alias: {alias}, chip_id: {chip}, prefill_graph: {g}_prefill, decode_graph: {g}_decode,"
        f" context_limit: 256, max_inflight: 1, max_waiting_requests: 64{sched}}}"
        for alias, chip, g in (("model-a", 0, "model_a"), ("model-b", 1, "model_b"))
    ]
    config = tmp / "dual.yaml"
    config.write_text(
        "schema: calculet-dual-model/v1\n"
        f"device: {{type: pcie, expected_chips: 2, combined_calbin: {COMBINED}}}\n"
        "models:\n" + "\n".join(models) + "\n"
        "recovery: {allow_session_reset: false, restart_process_on_unknown_dma: false}\n"
    )
    return plan, config


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


def test_000_s16_metrics_after_traffic_and_a_recovery(tmp_path: Path) -> None:
    plan, config = _files(tmp_path)
    with serving(time_scale=0.05, fault_plan=plan, config=config) as s:
        with httpx.Client(timeout=30) as c:
            ok = dict.fromkeys(ALIASES, 0)
            for alias in reversed(ALIASES):  # model-b first: the board reset after model-a's fault covers both
                prompt, tokens = golden(COMBINED, alias)
                n = 12 if alias == "model-a" else 3  # model-a's 12 cross its job 60: a CCU fault, a recovery
                for _ in range(n):
                    body = {"model": alias, "prompt": prompt, "max_tokens": len(tokens), "temperature": 0}
                    ok[alias] += c.post(f"{s.v1}/completions", json=body).status_code == 200
            assert ok["model-b"] == 3 and ok["model-a"] >= 1, ok
            wait_until(  # the supervisor's recovery thread resets and republishes
                lambda: s.supervisor.recoveries and all(s.engine.is_ready(a) for a in ALIASES),
                what="a finished recovery",
                interval=0.02,
                detail=lambda: s.supervisor.recoveries,
            )
            # A deadline of 1 µs has passed by the time the engine schedules: the request never reaches the
            # device, a starvation event in its prefill class (the golden prompt is short).
            prompt, _ = golden(COMBINED, "model-b")
            body = {"model": "model-b", "prompt": prompt, "max_tokens": 4, "timeout": 1e-6}
            starved = c.post(f"{s.v1}/completions", json=body)
            assert starved.status_code != 200, starved.text
            r = c.get(f"{s.url}/metrics")  # keyless server: /metrics is open
            assert r.status_code == 200, r.text
    m = _samples(r.text)
    for alias in ALIASES:
        for q in ("short", "medium", "long", "decode"):
            wait = _one(m, "calctl_queue_oldest_wait_seconds", model=alias, queue=q)
            assert wait >= 0 and math.isfinite(wait)
        assert _one(m, "calctl_kv_lane_wait_seconds", model=alias) >= 0
        assert _one(m, "calctl_kv_used_tokens", model=alias) >= 0
        # profiles [1]: every decode batch is full, and with no window (batching_window_us 0) fires at once
        assert _one(m, "calctl_batch_fill_ratio_count", model=alias) > 0
        fill_sum = _one(m, "calctl_batch_fill_ratio_sum", model=alias)
        assert fill_sum == _one(m, "calctl_batch_fill_ratio_count", model=alias)
        assert _one(m, "calctl_decode_batch_wait_seconds_count", model=alias) > 0
        assert _one(m, "calctl_decode_batch_wait_seconds_sum", model=alias) >= 0
        # every finished request released its lane: one free-latency observation each at least
        assert _one(m, "calctl_kv_free_latency_seconds_count", model=alias) >= (3 if alias == "model-b" else 1)
        for q in ("short", "medium", "long"):
            want = 1 if (alias, q) == ("model-b", "short") else 0
            assert _one(m, "calctl_starvation_events_total", model=alias, queue=q) == want, (alias, q)
        for t in TENANTS:
            lag = _one(m, "calctl_tenant_virtual_lag", model=alias, tenant=t)
            assert lag >= 0 and math.isfinite(lag)
        assert _one(m, "calctl_tenant_quota_limit", model=alias, tenant="default", quota="active_sequences") == 8
        assert math.isinf(_one(m, "calctl_tenant_quota_limit", model=alias, tenant="default", quota="waiting_tokens"))
        assert _one(m, "calctl_tenant_quota_limit", model=alias, tenant="batch", quota="waiting_tokens") == 4096
        assert _one(m, "calctl_tenant_quota_used", model=alias, tenant="batch", quota="active_sequences") == 0
        # board scope (allow_session_reset false): the recovery covered both aliases, and it took time
        took = _one(m, "calctl_recovery_duration_seconds_sum", model=alias, scope="board", result="ok")
        assert took > 0 and _one(m, "calctl_recovery_duration_seconds_count", model=alias, scope="board") == 1
    # bounded cardinality: tenants come from configuration only, never request ids
    tenants = {lab["tenant"] for lab, _ in m["calctl_tenant_virtual_lag"]}
    assert tenants == set(TENANTS), tenants
