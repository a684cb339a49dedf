"""Gate G2, ``calctl bench --scenario isolation``: replica isolation in-process (001 §12 Phase 2, §13.1, §17 G2).

A replica package (one model, A0 on chip 0 and A1 on chip 1) is served by the
engine in-process; after the serial golden, requests with their own prompts,
lengths and cancellation cues go to both aliases at once and every output is
compared with the package's float64 reference. Clean: GO. A mock fault plan
that corrupts the KV or the logits of one side: NO-GO naming the requests of
that side, and only of that side. A package that is not a replica and a bad
``--requests`` are refused (exit 2). The reference board runs it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calctl.package.reader import load_manifest
from calctl.runners.bench.base import BenchOptions, ScenarioResult
from calctl.runners.bench.bench_report import scenario_report
from calctl.runners.bench.isolation import CHECKS
from calctl.runners.bench.scenarios import SCENARIOS
from calctl.runners.device import DeviceSpec
from calctl.runtime import DeviceKind
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, CopyFixture, assert_no_traceback
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

REPLICA = FIXTURE_PACKAGES / "replica"
TRUST = ("--trusted-key", str(TEST_PUB))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REFERENCE_CHECKS = ("completed_equals_reference", "cancelled_prefix_of_reference")
# Ten decode jobs of one side, all after the load's golden and warm-up (which take fewer than 100). Which
# request a job serves depends on scheduling, and a corruption at a sequence's last step changes nothing
# visible, so ten faults make "at least one named request" certain rather than likely.
FAULT_JOBS = list(range(100, 600, 50))


def _run(tmp_path: Path, n: int, *, device: DeviceSpec | None = None, seed: int = 0) -> Any:
    lines: list[str] = []
    res = SCENARIOS["isolation"].run(
        BenchOptions(
            out_dir=tmp_path / "out",
            package=REPLICA,
            trust=make_policy([TEST_PUB], False),
            device=device or DeviceSpec(),
            seed=seed,
            requests=n,
        ),
        lines.append,
    )
    return res


def _exit_code(res: ScenarioResult) -> int:
    """The exit code of the scenario's report: its verdict's (calctl.report.exit_code_of)."""
    return scenario_report("bench", res, {}).exit_code


def _plan(tmp_path: Path, kind: str, graph: str, jobs: list[int]) -> Path:
    path = tmp_path / f"{kind}.yaml"
    path.write_text(
        "schema: calctl-fault-plan/v1\nseed: 3\nfaults:\n"
        f"  - kind: {kind}\n    graph: {graph}\n    job: {jobs}\n    magnitude: 4.0\n",
        encoding="utf-8",
    )
    return path


def _assert_go_body(body: dict[str, Any], n: int) -> None:
    req = body["requests"]
    assert req["sent"] == n and req["completed"] + req["cancelled"] == n and req["failed"] == 0, req
    assert req["completed"] > 0 and req["cancelled"] > 0, req
    cues = req["cancel_cues"]
    assert all(cues[k] > 0 for k in ("after_submit", "mid_decode", "timer")), cues
    assert {a["chip"] for a in req["by_alias"].values()} == {0, 1}
    assert all(a["sent"] == n // 2 for a in req["by_alias"].values()), req["by_alias"]
    assert list(body["checks"]) == list(CHECKS)
    for name, c in body["checks"].items():
        assert c["fail"] == 0 and c["first_failure"] is None, (name, c)
        assert c["pass"] > 0, name  # every check judged something
    assert body["checks"]["served"]["pass"] == n
    assert body["checks"]["completed_equals_reference"]["pass"] == req["completed"]
    assert body["checks"]["cancelled_prefix_of_reference"]["pass"] == req["cancelled"]
    assert body["checks"]["serial_golden"]["pass"] == 2 and body["checks"]["kv_released"]["pass"] == 2
    assert body["crosstalk"] == [] and body["no_go_action"] is None
    for side in body["kv"].values():
        assert side["after"] == side["before"], side
        assert side["after"]["kv_reserved_tokens"] == 0 and side["after"]["inflight_jobs"] == 0
    assert [s["chip"] for s in body["sides"]] == [0, 1]
    assert body["workload"]["alias_switches"] > n // 3  # the two sides' requests interleave
    assert body["trace"]["jobs"] > 0 and set(body["trace"]["per_chip_jobs"]) == {"0", "1"}


def _ndjson(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_clean_replica_is_go_with_its_evidence(tmp_path: Path) -> None:
    res = _run(tmp_path, 120)
    assert res.verdict == "GO" and _exit_code(res) == 0 and res.mock_result is True
    body = res.body
    _assert_go_body(body, 120)
    assert body["device"] == "mock" and "MOCK RESULT" in body["device_text"]
    assert body["device_options"]["kind"] == "mock" and body["device_options"]["time_scale"] == 0.1
    assert body["requests"]["threshold_met"] is False  # 120 < 1000: GO for what ran, and the report says so
    assert any("001 §13.1 asks for at least 1000" in n for n in res.notes)
    assert any(n.startswith("MOCK RESULT") for n in res.notes)
    files = body["files"]
    rows = _ndjson(files["requests_ndjson"])
    assert len(rows) == 120 and len({r["request_id"] for r in rows}) == 120
    assert len({r["prompt_tokens"] for r in rows}) > 20 and len({r["max_tokens"] for r in rows}) > 10  # lengths vary
    for r in rows:
        assert r["failures"] == [] and all(r["checks"].values()), r
        assert r["chip"] == {"model-a0": 0, "model-a1": 1}[r["alias"]]
        assert len(r["tokens"]) == r["max_tokens"] if r["outcome"] == "ok" else len(r["tokens"]) <= r["max_tokens"]
    cancelled = [r for r in rows if r["outcome"] == "cancelled"]
    assert all(r["cancel"] for r in cancelled)  # only the workload's own cues cancel
    before_first = [r for r in cancelled if r["tokens"] == []]
    mid = [r for r in cancelled if 0 < len(r["tokens"]) < r["max_tokens"]]
    assert len(before_first) == body["requests"]["cancelled_before_first_token"] > 0
    assert len(mid) == body["requests"]["cancelled_mid_decode"] > 0
    records = _ndjson(files["records_ndjson"])
    assert {r["record"] for r in records} == {"request", "job"}
    assert Path(files["plot"]).read_bytes()[:8] == PNG_MAGIC and res.plot == Path(files["plot"])
    trace = json.loads(Path(files["trace"]).read_text(encoding="utf-8"))
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    assert [g.name for g in res.gates] == [f"G2.{c}" for c in CHECKS] and all(g.passed for g in res.gates)


def test_the_cli_writes_the_scenarios_evidence_next_to_its_own(cli: Cli, tmp_path: Path) -> None:
    """Through ``calctl bench``. (Its default of 1000 requests, ``BenchOptions.requests``, is the run
    ``calctl accept`` makes: tests/integration/test_accept.py checks that run's evidence.)"""
    out = tmp_path / "rep"
    r = cli(
        "bench", "--scenario", "isolation", REPLICA, *TRUST, "--requests", "60", "--format", "json", "--report", out
    )
    assert_no_traceback(r)
    assert r.code == 0, r.err[-3000:]
    doc = r.json
    assert doc["scenario"] == "isolation" and doc["verdict"] == "GO" and doc["ok"] is True
    assert doc["mock_result"] is True and doc["device"] == "mock" and "MOCK RESULT" in doc["note"]
    _assert_go_body(doc, 60)
    assert doc["requests"]["threshold_met"] is False and doc["requests"]["threshold"] == 1000
    files = doc["files"]  # the scenario's evidence next to the CLI's own files
    assert files["report"] == str(out / "bench-report.json") and files["plot"] == str(out / "bench.png")
    for key in ("requests_ndjson", "records_ndjson", "trace"):
        assert Path(files[key]).is_file(), key
    assert len(_ndjson(files["requests_ndjson"])) == 60
    assert json.loads((out / "bench-report.json").read_text())["verdict"] == "GO"
    assert BenchOptions.requests == 1000  # 001 §13.1: "at least 1000 requests"


def _offending_requests(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in body["crosstalk"] if o["request_id"].startswith("iso-")]


def test_kv_corruption_on_one_chip_is_no_go_naming_its_requests(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "kv_corruption", "model_a1_decode", FAULT_JOBS)
    out = tmp_path / "rep"
    r = cli(
        "bench", "--scenario", "isolation", REPLICA, *TRUST, "--requests", "150",
        "--fault-plan", plan, "--format", "json", "--report", out,
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, r.err[-3000:]
    doc = r.json
    assert doc["verdict"] == "NO-GO" and doc["ok"] is False and doc["no_go_action"].startswith("do not enter")
    assert doc["device_options"]["fault_plan"] == str(plan)
    bad = _offending_requests(doc)
    assert bad, doc["crosstalk"]
    for o in bad:  # the corrupted side, by name; chip 0's replica is untouched
        assert o["alias"] == "model-a1" and o["chip"] == 1, o
        assert o["check"] in REFERENCE_CHECKS, o
        assert o["first_mismatch"] is not None and o["got_prefix"] != o["expected_prefix"], o
        assert "no reference produced" in o["source"], o
    failed = sum(doc["checks"][c]["fail"] for c in REFERENCE_CHECKS)
    assert failed == len(bad)
    assert doc["checks"]["served"]["fail"] == 0  # the device "succeeded": only the reference sees it
    assert len(doc["faults_fired"]) == len(FAULT_JOBS) and {f["kind"] for f in doc["faults_fired"]} == {"kv_corruption"}
    first = bad[0]
    assert any(
        n.startswith(f"failing gate {first['check']}: {first['request_id']} (model-a1, chip 1)") for n in doc["notes"]
    )
    assert "failing gate" in r.err  # named on stderr too with --format json
    rows = {row["request_id"]: row for row in _ndjson(doc["files"]["requests_ndjson"])}
    assert all(rows[o["request_id"]]["checks"][o["check"]] is False for o in bad)


def test_corrupt_output_is_no_go_naming_its_requests(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "corrupt_output", "model_a0_decode", FAULT_JOBS)
    res = _run(tmp_path, 150, device=DeviceSpec(fault_plan=plan))
    assert res.verdict == "NO-GO" and _exit_code(res) == 1
    bad = _offending_requests(res.body)
    assert bad and all(o["alias"] == "model-a0" and o["chip"] == 0 for o in bad), bad
    assert all(o["check"] in REFERENCE_CHECKS for o in bad)
    assert res.body["requests"]["failed"] == 0  # wrong tokens, not errors
    gate = {g.name: g for g in res.gates}
    assert any(gate[f"G2.{c}"].passed is False for c in REFERENCE_CHECKS)
    assert gate["G2.served"].passed is True


def test_a_halting_fault_is_no_go_and_the_reset_still_releases_the_kv(tmp_path: Path) -> None:
    path = tmp_path / "ccu.yaml"
    path.write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n  - kind: ccu_exception\n    graph: model_a1_decode\n    job: [100]\n",
        encoding="utf-8",
    )
    res = _run(tmp_path, 120, device=DeviceSpec(fault_plan=path))
    assert res.verdict == "NO-GO" and _exit_code(res) == 1
    body = res.body
    assert body["requests"]["failed"] > 0 and body["checks"]["served"]["fail"] == body["requests"]["failed"]
    assert body["recoveries"] and body["recoveries"][0]["alias"] == "model-a1", body["recoveries"]
    assert any(o["check"] == "served" and "CCU_EXCEPTION" in o["detail"] for o in body["crosstalk"])
    # What was delivered is still right, and the recovery gave the KV back on both chips.
    for name in (*REFERENCE_CHECKS, "own_generation", "request_record", "kv_released"):
        assert body["checks"][name]["fail"] == 0, (name, body["checks"][name])
    assert any("recovery(ies) during the run" in n for n in res.notes)


def test_a_fault_in_the_load_golden_stops_before_any_request(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "corrupt_output", "model_a0_prefill", [1])  # the engine's own golden before Ready
    res = _run(tmp_path, 50, device=DeviceSpec(fault_plan=plan))
    assert res.verdict == "NO-GO" and _exit_code(res) == 1
    body = res.body
    assert body["load_error"] and body["requests"]["sent"] == 0 and body["requests"]["not_sent"] == 50
    assert body["checks"]["serial_golden"]["fail"] >= 1
    o = body["crosstalk"][0]
    assert o["check"] == "serial_golden" and o["alias"] == "model-a0" and o["chip"] == 0, o


def test_a_stream_delivered_across_chips_is_no_go_naming_victim_and_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that serves one A0 request with an A1 request's prompt on chip 1: crosstalk, named both ways."""
    import dataclasses

    from calctl.runners.bench import isolation
    from calctl.runners.bench.isolation import run as isolation_run
    from calctl.serving.engine import ServingEngine

    pkg = load_manifest(REPLICA)
    arch = pkg.model("model-a0").architecture
    replica = isolation.check_replica(pkg, REPLICA, REPLICA)
    work = isolation.plan_workload(80, replica, vocab=arch.vocab_size, context=arch.context_limit, seed=0)
    victim = next(p for p in work if p.side.chip == 0 and not p.cancel and p.max_tokens >= 4)
    donor = next(p for p in work if p.side.chip == 1 and not p.cancel and p.max_tokens >= victim.max_tokens)

    class CrossWiredEngine(ServingEngine):
        def submit(self, req):
            if req.request_id == victim.request_id:
                req = dataclasses.replace(req, alias=donor.side.alias, prompt_ids=donor.prompt)
            return super().submit(req)

    monkeypatch.setattr(isolation_run, "ServingEngine", CrossWiredEngine)
    res = _run(tmp_path, 80)
    assert res.verdict == "NO-GO" and _exit_code(res) == 1
    named = [o for o in res.body["crosstalk"] if o["request_id"] == victim.request_id]
    assert named, res.body["crosstalk"]
    o = named[0]
    assert o["alias"] == "model-a0" and o["chip"] == 0 and o["check"] in REFERENCE_CHECKS, o
    assert set(o["checks_failed"]) >= {"completed_equals_reference", "request_record"}, o
    assert f"request {donor.request_id}'s (model-a1, chip 1)" in o["source"] and "across chips" in o["source"], o
    others = [x for x in res.body["crosstalk"] if x["request_id"].startswith("iso-") and x is not o]
    assert others == [], others  # nothing else was cross-wired


@pytest.mark.parametrize("kind", ["combined", "single"])
def test_a_package_that_is_not_a_replica_is_refused(cli: Cli, tmp_path: Path, kind: str) -> None:
    r = cli("bench", "--scenario", "isolation", FIXTURE_PACKAGES / kind, *TRUST, "--report", tmp_path / "rep")
    assert_no_traceback(r)
    assert r.code == 2, r.err
    assert f"package kind {kind!r}" in r.err and "needs a replica package" in r.err
    assert "sample-package --kind replica" in r.err
    assert not (tmp_path / "rep" / "isolation-requests.ndjson").exists()


def test_a_tampered_replica_is_refused_by_validation_not_judged(
    cli: Cli, copy_fixture: CopyFixture, tmp_path: Path
) -> None:
    root = copy_fixture("replica")
    pkg = load_manifest(root)
    for alias in ("model-a0", "model-a1"):  # the same change on both sides: still a replica, no longer sealed
        t = pkg.model(alias).params[0]
        blob = bytearray((root / t.file).read_bytes())
        blob[t.offset] ^= 0x01
        (root / t.file).write_bytes(bytes(blob))
    out = tmp_path / "rep"
    r = cli("bench", "--scenario", "isolation", root, *TRUST, "--requests", "10", "--report", out)
    assert_no_traceback(r)
    assert r.code == 1, r.err
    assert "failed validation" in r.err and "HASH" in r.err, r.err
    assert not (out / "isolation-requests.ndjson").exists()  # never served, never judged


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_request_counts_are_refused(cli: Cli, tmp_path: Path, value: str) -> None:
    r = cli("bench", "--scenario", "isolation", REPLICA, *TRUST, "--requests", value, "--report", tmp_path / "rep")
    assert_no_traceback(r)
    assert r.code == 2 and f"--requests {value}: expected at least 1" in r.err, r.err


def test_request_option_is_refused_where_it_does_not_apply(cli: Cli, tmp_path: Path) -> None:
    r = cli("bench", "--scenario", "batch", "--requests", "10", "--report", tmp_path / "rep")
    assert_no_traceback(r)
    assert r.code == 2 and "--requests applies to --scenario isolation only" in r.err, r.err
    r = cli("bench", "--scenario", "isolation", REPLICA, *TRUST, "--requests", "many", "--report", tmp_path / "rep")
    assert_no_traceback(r)
    assert r.code == 2 and "--requests" in r.err


def test_isolation_runs_on_the_reference_board(reference_board: Path, tmp_path: Path) -> None:  # noqa: F811
    res = _run(tmp_path, 80, device=DeviceSpec(kind=DeviceKind.CALRT, calrt_lib=reference_board))
    assert res.verdict == "GO", res.notes
    assert res.mock_result is False and res.body["device"] == "calrt"
    assert res.body["device_options"]["calrt_lib"] == str(reference_board)
    assert str(reference_board) in res.body["device_text"]
    assert res.body["runtime"]["firmware"] == "reference (software model, no hardware)"
    assert not any("MOCK" in n for n in res.notes)
    _assert_go_body(res.body, 80)


def test_bench_on_the_reference_board_is_labelled_a_software_model(
    cli: Cli,
    reference_board: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 28: a bench result through the reference board carries a software model's label, never reads as
    evidence about the board."""
    r = cli(
        "bench", "--scenario", "isolation", REPLICA, *TRUST, "--device", "calrt", "--calrt-lib", reference_board,
        "--requests", "40", "--report", tmp_path / "rep", "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    doc = r.json
    assert doc["mock_result"] is False, doc.get("note")
    assert doc["note"].startswith("SOFTWARE MODEL RESULT") and "not evidence about a Calculet board" in doc["note"]
