"""Issue 32 item 4: an imported package compiles decode profiles B1/B2/B4/B8, and ``calctl serve`` with a
scheduler configuration that lists them runs several streams' decode steps as one B>1 job, with each
stream's greedy text what it is alone.

The batching does not rest on timing luck: one B4 profile (threshold 1) and the longest batching window
(1 s) hold each decode step until all four same-prompt streams are ready or the window ends (000 §7.2
rule 4), so the streams meet in one job.
"""

from __future__ import annotations

import contextlib
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from calctl.package.reader import load_manifest
from calctl.runtime import open_runtime
from calctl.runtime.mock import compute
from calctl.serving.api.app import create_app
from calctl.serving.api.auth import ApiSettings
from calctl.serving.config import load_scheduler_config
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.signing.policy import make_policy
from tests.conftest import TEST_KEY, TEST_PUB, Cli
from tests.integration.serve_harness import golden
from tests.unit.compiler.checkpoint_factory import write_hf_dir
from tests.unit.serving_api.api_harness import ServerThread

TRUST = ("--trusted-key", str(TEST_PUB))
STREAMS = 4
MAX_TOKENS = 6


def _scheduler(tmp: Path, alias: str, *, window_us: int = 1000000) -> Path:
    path = tmp / "sched.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        schema: calculet-scheduler/v1
        model_alias: {alias}
        admission: {{max_waiting_requests: 64, max_waiting_prompt_tokens: 262144, deadline_default_ms: 120000}}
        queues: {{decode_weight: 8, short_prefill_weight: 4, medium_prefill_weight: 2, long_prefill_weight: 1,
                  short_prefill_max_tokens: 512, medium_prefill_max_tokens: 4096}}
        batch: {{profiles: [1, 4], batching_window_us: {window_us}, step_estimate_floor_us: 1000,
                profile_thresholds: {{4: 1}}, max_tenant_lane_share: 1.0}}
        executor: {{max_inflight: 1, fixed_engine: false}}
        recovery: {{max_resets_per_10min: 2, restart_on_unknown_dma: true}}
        """)
    )
    return path


def _complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_import_compiles_b1_to_b8_and_combine_keeps_them(cli: Cli, tmp_path: Path) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "qwen2", seed=5)
    assert cli("import", "hf", hf_dir, tmp_path / "A", "--key", TEST_KEY, "--alias", "q").code == 0
    dec = load_manifest(tmp_path / "A").model("q").decode
    assert dec.batch_profiles == (1, 2, 4, 8)
    pol = dec.inactive_lane_policy
    assert pol is not None and pol.mask_input == "lane_valid" and not pol.writes_kv
    r = cli("import", "hf", hf_dir, tmp_path / "B", "--key", TEST_KEY, "--alias", "q", "--profiles", "1,4")
    assert r.code == 0, r.err
    assert load_manifest(tmp_path / "B").model("q").decode.batch_profiles == (1, 4)
    one = cli("import", "hf", hf_dir, tmp_path / "C", "--key", TEST_KEY, "--alias", "q", "--profiles", "1")
    assert one.code == 0, one.err
    c1 = load_manifest(tmp_path / "C").model("q").decode
    assert c1.batch_profiles == (1,) and c1.inactive_lane_policy is None
    rep = cli("combine", tmp_path / "A", tmp_path / "A", tmp_path / "AA", "--key", TEST_KEY, *TRUST)
    assert rep.code == 0, rep.err
    assert all(m.decode.batch_profiles == (1, 2, 4, 8) for m in load_manifest(tmp_path / "AA").models)
    mixed = cli("combine", tmp_path / "A", tmp_path / "B", tmp_path / "AB", "--key", TEST_KEY, *TRUST, "--alias-b", "r")
    assert mixed.code == 0, mixed.err
    assert all(m.decode.batch_profiles == (1, 4) for m in load_manifest(tmp_path / "AB").models)
    for pkg in ("A", "AA", "AB"):
        assert cli("validate", tmp_path / pkg, *TRUST).code == 0, pkg
        assert cli("budget", tmp_path / pkg, *TRUST).code == 0, pkg
    assert cli("run-golden", tmp_path / "A", *TRUST).code == 0


@pytest.mark.parametrize(
    ("value", "needle"), [("2,4", "--profiles 2,4: expected 1 plus"), ("1,3", "1,3"), ("1,x", "1,x")]
)
def test_bad_profiles_exit_2_and_write_nothing(cli: Cli, tmp_path: Path, value: str, needle: str) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    r = cli("import", "hf", hf_dir, tmp_path / "pkg", "--key", TEST_KEY, "--profiles", value)
    assert r.code == 2 and needle in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "pkg").exists()


@contextlib.contextmanager
def _served(pkg: Path, scheduler: Path | None) -> Iterator[str]:
    configs = {"m": load_scheduler_config(scheduler)} if scheduler else None
    with open_runtime("mock", time_scale=0.0) as rt:
        sup = DeviceSupervisor(
            rt,
            trust=make_policy([TEST_PUB]),
            scheduler_configs=configs,
            options=SupervisorOptions(warmup_iterations=0, job_timeout_s=60.0),
        )
        try:
            sup.start(pkg)
            with ServerThread(create_app(ServingEngine(sup), ApiSettings(api_keys={}))) as server:
                yield server.base_url
        finally:
            sup.shutdown(2.0)


def test_serve_batches_the_streams_decode_into_one_b4_job(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama", seed=9)
    pkg = tmp_path / "pkg"
    assert cli("import", "hf", hf_dir, pkg, "--key", TEST_KEY, "--alias", "m", "--context", "128").code == 0
    prompt, _ = golden(pkg, "m")
    body = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    jobs: list[tuple[int, int]] = []  # (compiled batch, active lanes) of every decode job
    real = compute.run_graph

    def recording(model, kind, inputs, outputs, caches):
        if kind.value == "decode":
            jobs.append((inputs.batch, len(compute.decode_lanes(inputs))))
        real(model, kind, inputs, outputs, caches)

    monkeypatch.setattr(compute, "run_graph", recording)
    with _served(pkg, None) as url:  # the default configuration: B1 only
        alone = _complete(url, body)
    assert jobs and all(j == (1, 1) for j in jobs), jobs
    results: list[dict[str, Any]] = []
    with _served(pkg, _scheduler(tmp_path, "m")) as url:
        jobs.clear()  # the load's golden check ran at B1
        gate = threading.Barrier(STREAMS)

        def one() -> None:
            gate.wait()
            results.append(_complete(url, body))

        threads = [threading.Thread(target=one) for _ in range(STREAMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    assert len(results) == STREAMS
    n = alone["usage"]["completion_tokens"]
    assert n >= 2, alone
    for r in results:
        assert r["choices"][0]["text"] == alone["choices"][0]["text"], (r, alone)
        assert r["usage"]["completion_tokens"] == n
    # each stream's first token comes from its prefill, the others from B4 jobs that ran the lanes together
    assert all(b == 4 for b, _ in jobs) and sum(lanes for _, lanes in jobs) == STREAMS * (n - 1), jobs
    assert max(lanes for _, lanes in jobs) >= 2, jobs


def test_what_inactive_lanes_return_is_neither_read_nor_judged(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stream on a B4 profile (threshold 1, no window): three lanes of every decode job are inactive, and the
    package says they return no logits (``returns_logits: false``), so their rows are whatever the device left.
    Here they hold NaN: the engine neither reads nor judges them (its non-finite check is for the active lanes'
    rows, 000 §14), so the stream gets the text it gets at B1, not a ``corrupted output`` fault. The engine also
    zeroes only the active rows of a pooled output buffer: a B8 SmolLM2 job's logits are 1.5 MB."""
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama", seed=9)
    pkg = tmp_path / "pkg"
    assert cli("import", "hf", hf_dir, pkg, "--key", TEST_KEY, "--alias", "m", "--context", "128").code == 0
    assert not load_manifest(pkg).model("m").decode.inactive_lane_policy.returns_logits  # type: ignore[union-attr]
    prompt, _ = golden(pkg, "m")
    body = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    with _served(pkg, None) as url:
        alone = _complete(url, body)
    jobs: list[tuple[int, int]] = []
    real = compute.run_graph

    def garbage_in_inactive_rows(model, kind, inputs, outputs, caches):
        real(model, kind, inputs, outputs, caches)
        if kind.value == "decode":
            n = len(compute.decode_lanes(inputs))
            jobs.append((inputs.batch, n))
            outputs.device_view("logits")[n:] = np.nan

    monkeypatch.setattr(compute, "run_graph", garbage_in_inactive_rows)
    with _served(pkg, _scheduler(tmp_path, "m", window_us=0)) as url:
        jobs.clear()  # the load's golden check ran at B1
        one = _complete(url, body)
    assert jobs and all(j == (4, 1) for j in jobs), jobs
    assert one["choices"][0]["text"] == alone["choices"][0]["text"], (one, alone)
    assert one["usage"] == alone["usage"]
