"""Faults and recovery (001 §10.4, §11.1, §11.3, §13.4; 000 §15): a CCU fault on model A under joint traffic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from calctl.runtime.errors import InternalRuntimeError
from calctl.runtime.types import ResetScope
from calctl.serving.protocol import EngineRejection, GenerationRequest, SamplingParams
from tests.integration.serve_harness import COMBINED, Served, golden, serving
from tests.waiting import wait_until

A_JOB = 60  # loading runs 16 golden + 8 warm-up decode jobs of model_a_decode; job 60 falls in serving traffic


def _plan(tmp: Path, kind: str = "ccu_exception", scope: str = "chip") -> Path:
    plan = tmp / "faults.yaml"
    plan.write_text(
        textwrap.dedent(f"""\
        schema: calctl-fault-plan/v1
        seed: 3
        faults:
          - {{kind: {kind}, job: {A_JOB}, graph: model_a_decode, reset_scope: {scope}}}
        """)
    )
    return plan


def _config(
    tmp: Path, *, allow_session_reset: bool, max_resets: int | None = None, restart_process: bool = True
) -> Path:
    path = tmp / "dual.yaml"
    models = []
    for alias, chip, g in (("model-a", 0, "model_a"), ("model-b", 1, "model_b")):
        extra = ""
        if max_resets is not None:
            extra = (
                ", scheduler: {admission: {max_waiting_requests: 64, max_waiting_prompt_tokens: 262144,"
                " deadline_default_ms: 120000}, queues: {decode_weight: 8, short_prefill_weight: 4,"
                " medium_prefill_weight: 2, long_prefill_weight: 1, short_prefill_max_tokens: 512,"
                " medium_prefill_max_tokens: 4096}, batch: {profiles: [1], batching_window_us: 0},"
                " executor: {max_inflight: 1, fixed_engine: false},"
                f" recovery: {{max_resets_per_10min: {max_resets}, restart_on_unknown_dma: true}}}}"
            )
        models.append(
            f"  - {{alias: {alias}, chip_id: {chip}, prefill_graph: {g}_prefill, decode_graph: {g}_decode,"
            f" context_limit: 256, max_inflight: 1, max_waiting_requests: 64{extra}}}"
        )
    path.write_text(
        "schema: calculet-dual-model/v1\n"
        f"device: {{type: pcie, expected_chips: 2, combined_calbin: {COMBINED}}}\n"
        "models:\n" + "\n".join(models) + "\n"
        f"recovery: {{allow_session_reset: {str(allow_session_reset).lower()},"
        f" restart_process_on_unknown_dma: {str(restart_process).lower()}}}\n"
    )
    return path


def _joint_traffic(s: Served, a_n: int = 12, b_n: int = 30) -> tuple[Counter, Counter]:
    a_prompt, a_tokens = golden(COMBINED, "model-a")
    b_prompt, b_tokens = golden(COMBINED, "model-b")

    async def run() -> tuple[Counter, Counter]:
        a_res: Counter = Counter()
        b_res: Counter = Counter()
        async with httpx.AsyncClient(timeout=30) as c:

            async def loop(alias: str, prompt: list[int], n_tok: int, n: int, res: Counter) -> None:
                for _ in range(n):
                    r = await c.post(
                        f"{s.v1}/completions",
                        json={"model": alias, "prompt": prompt, "max_tokens": n_tok, "temperature": 0},
                    )
                    res[r.status_code] += 1
                    if r.status_code != 200:
                        await asyncio.sleep(0.05)

            await asyncio.gather(
                loop("model-a", a_prompt, len(a_tokens), a_n, a_res),
                loop("model-b", b_prompt, len(b_tokens), b_n, b_res),
            )
        return a_res, b_res

    counts = asyncio.run(run())
    # The fault's recovery runs on the supervisor's own thread: on a loaded host it may still be resetting or
    # warming when the last request returns. Read the outcome once it is recorded and every alias has settled.
    settled = ("Ready", "Failed")
    wait_until(
        lambda: bool(s.supervisor.recoveries) and all(w.state.value in settled for w in s.supervisor.cores.values()),
        what="the fault's recovery to be recorded and every alias Ready or Failed",
        timeout=60,
        detail=lambda: ({a: w.state.value for a, w in s.supervisor.cores.items()}, len(s.supervisor.recoveries)),
    )
    return counts


def _states(s: Served, alias: str) -> list[str]:
    return [e.state for e in s.supervisor.history if e.alias == alias]


def measure(tmp: Path, *, allow_session_reset: bool) -> dict[str, Any]:
    """The closing-note measurement: scope, B's success rate and both generations after a CCU fault on A."""
    with serving(
        time_scale=0.2, fault_plan=_plan(tmp), config=_config(tmp, allow_session_reset=allow_session_reset)
    ) as s:
        before = {a: w.generation for a, w in s.supervisor.cores.items()}
        a_res, b_res = _joint_traffic(s)
        after = {a: w.generation for a, w in s.supervisor.cores.items()}
        recs = list(s.supervisor.recoveries)
        states = {a: _states(s, a) for a in s.supervisor.cores}
    return {
        "allow_session_reset": allow_session_reset,
        "scopes": [r.scope for r in recs],
        "affected": [list(r.affected_aliases) for r in recs],
        "ok": [r.ok for r in recs],
        "a": dict(a_res),
        "b": dict(b_res),
        "b_success_rate": b_res[200] / sum(b_res.values()),
        "generations_before": before,
        "generations_after": after,
        "states": states,
    }


def test_default_scope_is_board_both_aliases_drain_reset_and_republish(tmp_path: Path) -> None:
    """001 §11.3: with allow_session_reset false (the default) a CCU fault on A resets the whole board."""
    m = measure(tmp_path, allow_session_reset=False)
    print("measured:", json.dumps({k: v for k, v in m.items() if k != "states"}))  # the closing note's numbers
    assert m["scopes"] == ["board"] and m["affected"] == [["model-a", "model-b"]] and m["ok"] == [True], m
    gb, ga = m["generations_before"], m["generations_after"]
    assert ga["model-a"] > gb["model-a"] and ga["model-b"] > gb["model-b"], m
    for alias in ("model-a", "model-b"):
        st = m["states"][alias]
        assert st[:4] == ["Validating", "Configuring", "Warming", "Ready"], st  # 001 §11.1
        i = st.index("Draining", st.index("Ready"))
        assert st[i : i + 4] == ["Draining", "Recovering", "Warming", "Ready"], st


def test_chip_scope_only_when_session_reset_is_allowed(tmp_path: Path) -> None:
    m = measure(tmp_path, allow_session_reset=True)
    print("measured:", json.dumps({k: v for k, v in m.items() if k != "states"}))
    assert m["scopes"] == ["chip"] and m["affected"] == [["model-a"]] and m["ok"] == [True], m
    assert m["b"] == {200: 30}, m
    assert m["generations_after"]["model-b"] == m["generations_before"]["model-b"], m


def test_max_resets_zero_never_resets_and_fails_with_the_reason(tmp_path: Path) -> None:
    cfg = _config(tmp_path, allow_session_reset=False, max_resets=0)
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path), config=cfg) as s:
        resets: list[Any] = []
        real = s.rt.reset

        def spy_reset(*a: Any, **k: Any) -> None:
            resets.append(a)
            real(*a, **k)

        s.rt.reset = spy_reset
        _joint_traffic(s, a_n=12, b_n=4)
        rec = s.supervisor.recoveries
        ready = httpx.get(f"{s.url}/health/ready")
        metrics = httpx.get(f"{s.url}/metrics").text
    assert resets == [] and len(rec) == 1 and rec[0].scope == "none" and not rec[0].ok, rec
    assert ready.status_code == 503 and "max_resets_per_10min is 0" in ready.json()["failed"]["model-a"]
    assert 'calctl_model_state{model="model-a",state="Failed"} 1.0' in metrics


def test_a_failed_reset_takes_both_out_then_device_recovery_then_failed(tmp_path: Path) -> None:
    """001 §11.3 row 6: a failed reset is never left in Recovering."""
    cfg = _config(tmp_path, allow_session_reset=True)
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path), config=cfg) as s:
        calls: list[str] = []

        def broken(scope: Any = "chip", chip: Any = None) -> None:
            calls.append(str(getattr(scope, "value", scope)))
            raise InternalRuntimeError("reset failed (injected)")

        s.rt.reset = broken
        _joint_traffic(s, a_n=12, b_n=4)
        rec = s.supervisor.recoveries
        ready = httpx.get(f"{s.url}/health/ready").json()
        states = {a: w.state.value for a, w in s.supervisor.cores.items()}
    assert calls == ["chip", "board"], calls
    assert len(rec) == 1 and rec[0].scope == "device" and not rec[0].ok
    assert rec[0].affected_aliases == ("model-a", "model-b")
    assert states == {"model-a": "Failed", "model-b": "Failed"}, states
    assert "device-level board reset failed too" in ready["failed"]["model-b"], ready


def test_recovery_saves_the_trace_window_and_job_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_RECOVERY_DIR", str(tmp_path / "evidence"))
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path)) as s:
        _joint_traffic(s, a_n=12, b_n=4)
        (rec,) = s.supervisor.recoveries
    assert rec.evidence is not None
    doc = json.loads(Path(rec.evidence).read_text())
    assert doc["schema"] == "calctl-recovery-evidence/v1" and doc["device"] == "mock"
    assert doc["reason"] and doc["alias"] == "model-a" and set(doc["jobs"]) == {"model-a", "model-b"}
    assert any(e["model"] == "model-a" for e in doc["trace"]), doc["trace"][:3]
    # 001 §14 job records from the flight recorder, without `serve --records`: the faulted job is A's last.
    jobs = doc["records"]["jobs"]
    a_jobs = [j for j in jobs if j["model_alias"] == "model-a"]
    assert a_jobs and a_jobs[-1]["output_status"] == "fault", a_jobs[-3:]
    assert {j["model_alias"] for j in jobs} == {"model-a", "model-b"}
    ok = [j for j in a_jobs if j["output_status"] == "ok"]
    assert ok and all(j["infer_ms"] is not None and j["kv_after"] is not None for j in ok[-3:]), ok[-3:]
    assert any(r["model_alias"] == "model-b" and r["finish_reason"] for r in doc["records"]["requests"])


@pytest.mark.parametrize("restart_process", [True, False])
def test_unknown_dma_state_follows_restart_process_on_unknown_dma(tmp_path: Path, restart_process: bool) -> None:
    """001 §10.4 restart_process_on_unknown_dma: Failed, asking for a process restart; else a board recovery."""
    cfg = _config(tmp_path, allow_session_reset=True, restart_process=restart_process)
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path, "unknown_dma_state"), config=cfg) as s:
        _joint_traffic(s, a_n=12, b_n=4)
        (rec,) = s.supervisor.recoveries
        states = {a: w.state.value for a, w in s.supervisor.cores.items()}
        ready = httpx.get(f"{s.url}/health/ready").json()
    assert rec.affected_aliases == ("model-a", "model-b"), rec
    if restart_process:
        assert rec.scope == "process" and not rec.ok and states == {"model-a": "Failed", "model-b": "Failed"}
        assert "restart the serving process" in ready["failed"]["model-a"], ready
    else:  # restart_on_unknown_dma (000 §15): board scope even though session reset is allowed
        assert rec.scope == "board" and rec.ok and states == {"model-a": "Ready", "model-b": "Ready"}, rec


def test_internal_status_reports_the_recoveries_the_docs_promise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile test of issue 19: docs/serve.md sends the operator to ``GET /internal/status`` for the recovery
    records and their evidence files; the route did not exist (404), so over HTTP nothing said a recovery
    happened, in which scope, or where its evidence is."""
    monkeypatch.setenv("CALCTL_RECOVERY_DIR", str(tmp_path / "evidence"))
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path)) as s:
        _joint_traffic(s, a_n=12, b_n=4)
        r = httpx.get(f"{s.url}/internal/status")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["device"] == "mock"
    assert set(doc["models"]) == {"model-a", "model-b"}
    assert all(m["state"] == "Ready" for m in doc["models"].values()), doc["models"]
    (rec,) = doc["recoveries"]
    assert rec["scope"] == "board" and rec["affected_aliases"] == ["model-a", "model-b"] and rec["ok"], rec
    assert rec["evidence"] and Path(rec["evidence"]).is_file(), rec
    assert rec["generations"] == {a: m["generation"] for a, m in doc["models"].items()}
    assert doc["failures"] == {} and doc["records"]["dropped"] == 0


def test_one_board_wide_hang_is_one_board_recovery_not_one_per_alias(tmp_path: Path) -> None:
    """Hostile test of issue 19: a board-scope wait_timeout hangs both chips, so A's and B's jobs both time
    out; B's request waited behind A's board recovery (which already reset and republished B) and then reset
    the board a second time, spending the reset budget (max_resets_per_10min: 2) on one fault."""
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path, "wait_timeout", "board"), job_timeout_s=1.5) as s:
        _joint_traffic(s, a_n=12, b_n=30)
        recs = list(s.supervisor.recoveries)
        states = {a: w.state.value for a, w in s.supervisor.cores.items()}
    assert [r.scope for r in recs] == ["board"], [(r.alias, r.reason, r.scope) for r in recs]
    assert states == {"model-a": "Ready", "model-b": "Ready"}, states


def test_refusals_before_output_carry_public_text_not_the_engines(tmp_path: Path) -> None:
    """Hostile test of issue 19: a request failed before its first token got the core's own detail as its
    message (`model-a: deadline expired in PrefillReady`, the runtime's fault text naming the job and chip);
    docs/serve.md: the engine's text goes to the log only, public responses never name chips."""
    import re

    messages: list[str] = []
    a_prompt, a_tokens = golden(COMBINED, "model-a")
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path)) as s:

        async def run() -> None:
            async with httpx.AsyncClient(timeout=30) as c:

                async def one(i: int) -> None:
                    body: dict[str, Any] = {"model": "model-a", "prompt": a_prompt, "max_tokens": len(a_tokens)}
                    if i % 3 == 0:
                        body["timeout"] = 0.05  # some expire after admission, before their first token
                    r = await c.post(f"{s.v1}/completions", json={**body, "temperature": 0})
                    if r.status_code == 503:
                        messages.append(r.json()["error"]["message"])

                await asyncio.gather(*(one(i) for i in range(30)))

        asyncio.run(run())
    assert messages, "no request was refused: the fault or the deadlines did not bite"
    leaks = [m for m in messages if re.search(r"chip|job \d|PrefillReady|Decode|CalCore|ccu|injected", m)]
    assert not leaks, leaks


def test_a_refused_chip_reset_drains_b_before_the_board_reset(tmp_path: Path) -> None:
    """Issue 29 item 1, 001 §11.2: a runtime that grants only board resets (CalRT 0.7.6), a chip-scoped fault on
    A with ``allow_session_reset: true``, B streaming. The chip reset is refused, so the board is reset: before
    that call B is out of admission and drained (its streams finish, or end with the recovery outcome
    ``generation_retired``), never ``device_error`` from a reset calctl chose, and no job is submitted between
    the board reset and the reconfigure (B submitted into the wiped board: NotConfigured)."""

    cfg = _config(tmp_path, allow_session_reset=True)
    b_prompt, _ = golden(COMBINED, "model-b")
    a_prompt, a_tokens = golden(COMBINED, "model-a")
    with serving(
        time_scale=0.2, fault_plan=_plan(tmp_path), config=cfg, runtime_options={"reset_scopes": (ResetScope.BOARD,)}
    ) as s:
        calls: list[str] = []
        rt = s.rt
        real_reset, real_submit, real_configure = rt.reset, rt.submit, rt.configure

        def reset(scope: Any = "chip", chip: Any = None) -> None:
            calls.append(f"reset {getattr(scope, 'value', scope)}")
            real_reset(scope, chip)

        def submit(*a: Any, **k: Any) -> Any:
            calls.append("submit")
            return real_submit(*a, **k)

        def configure(*a: Any, **k: Any) -> Any:
            calls.append("configure")
            return real_configure(*a, **k)

        rt.reset, rt.submit, rt.configure = reset, submit, configure

        async def run() -> list[Any]:
            def req(alias: str, i: int, prompt: list[int], n: int, ignore_eos: bool) -> GenerationRequest:
                return GenerationRequest(
                    f"{alias}-{i}", alias, "default", tuple(prompt), n, SamplingParams(temperature=0), None, ignore_eos
                )

            async def consume(stream: Any, progress: asyncio.Event) -> Any:
                await stream.admitted()
                async for ev in stream:
                    if ev.completion_tokens >= 3:
                        progress.set()
                    if ev.finish is not None:
                        return ev
                return None

            room = 256 - len(b_prompt) - 1
            started = [asyncio.Event() for _ in range(4)]
            b = [
                asyncio.ensure_future(consume(s.engine.submit(req("model-b", i, b_prompt, room, True)), started[i]))
                for i in range(4)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            for i in range(40):  # A's traffic until its fault (job 60) has been recovered from
                if s.supervisor.recoveries or all(t.done() for t in b):
                    break
                with contextlib.suppress(EngineRejection):
                    await consume(s.engine.submit(req("model-a", i, a_prompt, len(a_tokens), False)), asyncio.Event())
            return list(await asyncio.wait_for(asyncio.gather(*b), 120))

        ends = asyncio.run(run())
        recs = wait_until(lambda: list(s.supervisor.recoveries), what="the recovery of A's fault", timeout=60)
    assert [(r.scope, r.affected_aliases, r.ok) for r in recs] == [("board", ("model-a", "model-b"), True)], recs
    outcomes = [e.outcome for e in ends]
    assert all(o in ("stop", "length", "generation_retired") for o in outcomes), [(e.outcome, e.error) for e in ends]
    board = calls.index("reset board")
    assert calls[:board].count("reset chip") == 1, calls
    after = calls[board + 1 :]
    assert "submit" not in after[: after.index("configure")], calls[board:][:10]


def test_an_unexpected_error_in_a_recovery_leaves_no_alias_recovering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27 item 2: a bug inside ``recover`` (here: writing the evidence raises) was only logged and left
    both aliases in Recovering for good. They go Failed with the reason, and the attempt is recorded."""
    with serving(time_scale=0.2, fault_plan=_plan(tmp_path)) as s:

        def broken(*_a: Any, **_k: Any) -> None:
            raise RuntimeError("evidence store exploded")

        monkeypatch.setattr(s.supervisor, "_save_evidence", broken)
        _joint_traffic(s, a_n=12, b_n=4)
        recs = wait_until(lambda: list(s.supervisor.recoveries), what="the failed recovery to be recorded")
        states = {a: w.state.value for a, w in s.supervisor.cores.items()}
        ready = httpx.get(f"{s.url}/health/ready").json()
    assert states == {"model-a": "Failed", "model-b": "Failed"}, states
    assert len(recs) == 1 and not recs[0].ok and "evidence store exploded" in recs[0].detail, recs
    assert "internal error: RuntimeError: evidence store exploded" in ready["failed"]["model-b"], ready
