"""Issue 6 acceptance on the mock device: ``run-golden``, ``warmup``, traces and ``bringup``, in-process via the CLI.

Fault plans (docs/runtime.md §4) make the failures real: a corrupted output, corrupted KV and a
hang are injected into the device, and the runner must name what broke, exit with the documented
code and still leave a report. Times asserted are generous ratios of the configured deadline.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, CliResult, CopyFixture, assert_no_traceback
from tests.waiting import wait_until

TRUST = ("--trusted-key", str(TEST_PUB))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _plan(tmp_path: Path, name: str, *faults: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text("schema: calctl-fault-plan/v1\nfaults:\n" + "".join(f"  - {f}\n" for f in faults))
    return path


def _golden(cli: Cli, *args: object) -> CliResult:
    r = cli("run-golden", *args, *TRUST, "--format", "json")
    assert_no_traceback(r)
    return r


def _steps(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["steps"]}


# ---------------------------------------------------------------------------
# run-golden


@pytest.mark.parametrize("kind", ["single", "combined", "replica"])
def test_run_golden_passes_on_every_sample_package(cli: Cli, kind: str) -> None:
    pkg = FIXTURE_PACKAGES / kind
    r = _golden(cli, pkg)
    assert r.code == 0, r.err
    doc = r.json
    # Passed, with the test-only key's warning named: WARN, exit 0 (docs/cli.md "Verdicts").
    assert doc["verdict"] == "WARN" and doc["exit_code"] == 0 and doc["error"] is None
    assert [w for w in doc["warnings"] if "SIG002" in w] == doc["warnings"] and doc["warnings"]
    # Every report names the device, runtime version, package digest and signer, and labels mock results.
    assert doc["device"] == "mock" and doc["mock_result"] is True and "MOCK RESULT" in doc["note"]
    assert doc["runtime"]["runtime"] == "0.7.6"
    assert doc["package"]["digest"] and doc["package"]["signer_key_id"]
    assert [m["alias"] for m in doc["models"]] == [m for m in _aliases(kind)]
    for m in doc["models"]:
        assert m["ok"] and m["prefill_allclose"] and m["topk_agree"] and m["first_mismatch"] is None
        assert m["got_tokens"] == m["expected_tokens"] and len(m["got_tokens"]) == 16
    steps = [s["name"] for s in doc["steps"]]
    assert steps[:5] == ["open device", "validate package", "load package", "create calbin", "configure"]
    assert steps[-3:] == ["drain", "reset configuration", "release"]
    assert all(s["status"] in ("PASS", "WARN") for s in doc["steps"])
    assert all(
        a["used_bytes"] == b["used_bytes"] for a, b in zip(doc["memory"]["after"], doc["memory"]["before"], strict=True)
    )


def _aliases(kind: str) -> list[str]:
    return {"single": ["model-a"], "combined": ["model-a", "model-b"], "replica": ["model-a0", "model-a1"]}[kind]


def test_run_golden_records_the_programs_configured_on_each_chip(cli: Cli) -> None:
    import hashlib

    pkg = FIXTURE_PACKAGES / "combined"
    doc = _golden(cli, pkg).json
    chips = {c["chip"]: c["programs"] for c in doc["programs"]}
    assert set(chips) == {0, 1}
    for chip, programs in chips.items():
        model = "model-a" if chip == 0 else "model-b"
        # one ELF and one command blob per (CalCore, chip) for each of the model's two graphs
        assert len(programs) == 8 and {p["model"] for p in programs} == {model}
        assert {p["kind"] for p in programs} == {"code", "command"}
        for p in programs:
            assert p["sealed"] is True
            assert p["sha256"] == hashlib.sha256((pkg / p["file"]).read_bytes()).hexdigest()
            assert p["file"].endswith(f"_chip{chip}.elf") or p["file"].endswith(f"_chip{chip}.cmd")


def test_one_model_by_exact_alias_and_unknown_alias_is_usage(cli: Cli) -> None:
    pkg = FIXTURE_PACKAGES / "combined"
    r = _golden(cli, pkg, "--model", "model-b")
    assert r.code == 0 and [m["alias"] for m in r.json["models"]] == ["model-b"]
    r = cli("run-golden", pkg, *TRUST, "--model", "model")  # a prefix is not an alias (001 §10.4)
    assert r.code == 2 and "model-a, model-b" in r.err
    assert_no_traceback(r)


def test_corrupted_output_exits_1_naming_model_step_and_position(cli: Cli, tmp_path: Path) -> None:
    # The 3rd decode job of model-b (decode[2], producing output token 3) returns perturbed logits.
    plan = _plan(tmp_path, "corrupt", "{kind: corrupt_output, job: 3, graph: model_b_decode, magnitude: 8.0}")
    r = _golden(cli, FIXTURE_PACKAGES / "combined", "--fault-plan", plan)
    assert r.code == 1
    doc = r.json
    assert doc["verdict"] == "FAIL"
    a, b = doc["models"]
    assert a["ok"] and not b["ok"] and b["first_mismatch"] == 3
    assert b["reason"].startswith("model-b: decode[2]: output token 3, KV position ")
    assert "model-b: decode[2]" in doc["error"]
    assert _steps(doc)["golden model-b"]["status"] == "FAIL"


def test_corrupted_prefill_logits_are_caught_at_the_prefill(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "corrupt", "{kind: corrupt_output, job: 1, graph: model_a_prefill, magnitude: 0.5}")
    r = _golden(cli, FIXTURE_PACKAGES / "single", "--fault-plan", plan)
    assert r.code == 1
    m = r.json["models"][0]
    assert not m["prefill_allclose"] and m["reason"].startswith("model-a: prefill: logits outside rtol=")
    assert "vocab index" in m["reason"] and "prompt position 21" in m["reason"]


def test_kv_corruption_exits_1(cli: Cli, tmp_path: Path) -> None:
    # The prefill succeeds with correct logits; the K/V it wrote are perturbed, so decode diverges.
    plan = _plan(tmp_path, "kv", "{kind: kv_corruption, job: 1, graph: model_a_prefill, magnitude: 4.0}")
    r = _golden(cli, FIXTURE_PACKAGES / "single", "--fault-plan", plan)
    assert r.code == 1
    m = r.json["models"][0]
    assert m["prefill_allclose"] and not m["ok"] and m["first_mismatch"] >= 1
    assert m["reason"].startswith(f"model-a: decode[{m['first_mismatch'] - 1}]")


def test_hang_exits_4_within_the_timeout_and_leaves_a_partial_report(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "hang", "{kind: wait_timeout, job: 4, graph: model_a_decode}")
    report = tmp_path / "out" / "golden.json"
    timeout = 1.0
    t0 = time.monotonic()
    r = _golden(cli, FIXTURE_PACKAGES / "combined", "--fault-plan", plan, "--step-timeout", timeout, "--report", report)
    elapsed = time.monotonic() - t0
    assert r.code == 4
    assert elapsed < 20  # the whole command: validation + 1 s deadline + teardown, generously
    for doc in (r.json, json.loads(report.read_text())):  # stdout and --report hold the same partial report
        assert doc["verdict"] == "TIMEOUT" and doc["exit_code"] == 4
        step = _steps(doc)["golden model-a"]
        assert step["status"] == "TIMEOUT" and timeout <= step["seconds"] < 3 * timeout
        assert "decode[3]" in step["detail"] and "chip reset of chip 0" in step["detail"]
        (partial,) = doc["models"]  # the steps before the hang are kept
        assert partial["alias"] == "model-a" and not partial["ok"] and len(partial["got_tokens"]) == 4
        assert doc["not_run"] == [{"alias": "model-b", "reason": "not run: model-a hung"}]
        # and the board was left clean
        assert [_steps(doc)[s]["status"] for s in ("drain", "reset configuration", "release")] == ["PASS"] * 3


def test_a_hung_warmup_lists_the_models_it_did_not_reach(cli: Cli, tmp_path: Path) -> None:
    """The one per-model skeleton: warm-up keeps the partial result and names the models after the hang, as
    run-golden does (warm-up used to drop them from the report)."""
    plan = _plan(tmp_path, "hang", "{kind: wait_timeout, job: 4, graph: model_a_decode}")
    r = cli(
        "warmup", FIXTURE_PACKAGES / "combined", *TRUST, "--fault-plan", plan, "--step-timeout", "1", "-n", "3",
        "--format", "json",
    )  # fmt: skip
    assert r.code == 4, r.err
    doc = r.json
    assert doc["verdict"] == "TIMEOUT" and [m["alias"] for m in doc["models"]] == ["model-a"]
    assert doc["not_run"] == [{"alias": "model-b", "reason": "not run: model-a hung"}]


def test_a_package_failing_validation_never_reaches_configure(cli: Cli, copy_fixture: CopyFixture) -> None:
    pkg = copy_fixture("single")
    target = pkg / "model-a" / "decode" / "ccu0_chip0.cmd"
    data = bytearray(target.read_bytes())
    data[0] ^= 0xFF
    target.write_bytes(bytes(data))
    r = _golden(cli, pkg)
    assert r.code == 1
    doc = r.json
    assert doc["verdict"] == "FAIL" and "failed validation" in doc["error"]
    assert doc["validation"]["failed_rules"] and all(rule in doc["error"] for rule in doc["validation"]["failed_rules"])
    names = [s["name"] for s in doc["steps"]]
    assert "create calbin" not in names and "configure" not in names and doc["programs"] == []


def test_missing_calrt_library_is_a_device_error_with_a_report(cli: Cli, tmp_path: Path) -> None:
    r = _golden(cli, FIXTURE_PACKAGES / "single", "--device", "calrt", "--calrt-lib", tmp_path / "nope.so")
    assert r.code == 3
    assert r.json["verdict"] == "ERROR" and r.json["device"] == "calrt" and r.json["mock_result"] is False
    assert _steps(r.json)["open device"]["status"] == "ERROR"


def test_ctrl_c_releases_everything_and_exits_130(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import calctl.checks.golden as golden

    def interrupted(rt, model, prompt, n_tokens, **_: object):
        """Submit a real prefill, then Ctrl-C while it is in flight (its buffers and KV owned by the job)."""
        seq = rt.kv.allocate(model.alias)
        inputs, outputs = rt.alloc_inputs(model.prefill.name), rt.alloc_outputs(model.prefill.name)
        tokens = np.zeros(inputs.layout.slot("tokens").shape, np.int32)
        tokens[0, : len(prompt)] = prompt
        inputs.write("tokens", tokens)
        inputs.write("n_tokens", np.array([len(prompt)], np.int32))
        rt.kv.append(seq, len(prompt))
        rt.submit(model.prefill.name, inputs, outputs, kv=[seq])
        raise KeyboardInterrupt

    monkeypatch.setattr(golden, "greedy_run", interrupted)
    report = tmp_path / "r.json"
    r = cli("run-golden", FIXTURE_PACKAGES / "single", *TRUST, "--report", report)
    assert r.code == 130
    doc = json.loads(report.read_text())
    assert doc["verdict"] == "INTERRUPTED" and _steps(doc)["golden model-a"]["status"] == "INTERRUPTED"
    assert [_steps(doc)[s]["status"] for s in ("drain", "reset configuration", "release")] == ["PASS"] * 3
    from calctl.runtime import open_runtime

    with open_runtime("mock") as rt:  # the one device per process was released
        assert all(c.pending == 0 for c in rt.counters())


# ---------------------------------------------------------------------------
# traces


def test_trace_json_and_png_show_one_track_per_chip(cli: Cli, tmp_path: Path) -> None:
    trace, plot = tmp_path / "t" / "golden.trace.json", tmp_path / "t" / "golden.png"
    r = _golden(cli, FIXTURE_PACKAGES / "combined", "--trace", trace, "--plot", plot)
    assert r.code == 0
    assert r.json["trace"] == {"json": str(trace), "plot": str(plot)}
    doc = json.loads(trace.read_text())
    assert doc["otherData"]["device"] == "mock" and doc["otherData"]["package_digest"] == r.json["package"]["digest"]
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "chip0", 1: "chip1"}
    jobs = [e for e in events if e["ph"] == "X"]
    assert len(jobs) == 32  # 2 models x (1 prefill + 15 decodes)
    assert {e["tid"] for e in jobs} == {0, 1}
    for e in jobs:
        assert e["pid"] == 1 and e["dur"] > 0 and e["ts"] >= 0
        assert set(e["args"]) >= {"model", "graph", "engine", "generation", "job_id"}
        assert e["args"]["model"] == ("model-a" if e["tid"] == 0 else "model-b")
    data = plot.read_bytes()
    assert data[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", data[16:24])
    assert width > 400 and height > 100


# ---------------------------------------------------------------------------
# warmup


def test_warmup_reports_percentiles_per_graph(cli: Cli) -> None:
    r = cli(
        "warmup", FIXTURE_PACKAGES / "combined", *TRUST, "--iterations", "4", "--decode-steps", "3", "--format", "json"
    )
    assert_no_traceback(r)
    assert r.code == 0, r.err
    doc = r.json
    assert doc["verdict"] == "WARN" and doc["iterations"] == 4 and doc["cv_warn"] == 0.25
    assert any("SIG002" in w for w in doc["warnings"])
    for m in doc["models"]:
        assert m["ok"] and m["errors"] == 0 and m["iterations"] == 4
        prefill, decode = (f"{m['alias'].replace('-', '_')}_{k}" for k in ("prefill", "decode"))
        assert set(m["graphs"]) == {prefill, decode}
        # the cold first iteration is left out of the statistics
        assert m["graphs"][prefill]["count"] == 3 and m["graphs"][decode]["count"] == 9
        p = m["graphs"][decode]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= p["max"]
        assert set(m["unstable"]) <= {prefill, decode}


def test_warmup_counts_tokens_off_golden_as_errors(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "corrupt", "{kind: corrupt_output, job: 5, graph: model_a_decode, magnitude: 8.0}")
    r = cli(
        "warmup",
        FIXTURE_PACKAGES / "single",
        *TRUST,
        "--iterations",
        "3",
        "--decode-steps",
        "3",
        "--fault-plan",
        plan,
        "--format",
        "json",
    )
    assert r.code == 1
    (m,) = r.json["models"]
    # decode job 5 is iteration 1's second decode job: one iteration wrong, the others right
    assert m["errors"] == 1 and m["iterations"] == 3 and not m["ok"]
    assert m["first_error"].startswith("model-a: iteration 1: decode[1]: output token 2")


# ---------------------------------------------------------------------------
# bringup


def test_bringup_with_no_arguments_exits_0(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("bringup")
    assert_no_traceback(r)
    assert r.code == 0, r.out + r.err
    (out,) = tmp_path.glob("calctl-reports/bringup-*")  # the documented default report directory
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] in ("PASS", "WARN") and doc["device"] == "mock" and doc["mock_result"] is True
    assert doc["runtime"]["runtime"] == "0.7.6" and doc["package"]["digest"] and doc["package"]["signer_key_id"]
    summary = {s["step"]: s for s in doc["summary"]}
    assert list(summary) == [
        "device-check", "conformance", "selftest", "burn-in", "validate", "budget", "run-golden", "warmup", "poc", "soak"
    ]  # fmt: skip
    assert summary["device-check"]["verdict"] == "PASS"  # the board first (issue 51 item 6) ...
    conformance = summary["conformance"]  # the ABI suite checks a vendor's library: not the mock, said so
    assert conformance["verdict"] == "SKIP" and "calctl device conformance --calrt-lib" in conformance["detail"]
    assert summary["selftest"]["verdict"] == "NOT JUDGED"  # ... no board profile: figures, not a WARN of its own
    assert summary["burn-in"]["verdict"] == "SKIP" and "--level long" in summary["burn-in"]["detail"]
    assert doc["step_reports"]["selftest"]["rows"] and doc["step_reports"]["device-check"]["ready"] is True
    assert summary["budget"]["verdict"] == "GO" and summary["run-golden"]["verdict"] == "WARN"
    # the bundled sample compiles B4: run-golden held each model's B4 lanes to their B1 twins
    assert [[b["batch"] for b in m["batch"]] for m in doc["step_reports"]["run-golden"]["models"]] == [[4], [4]]
    assert summary["poc"]["verdict"] == "S2"
    assert summary["soak"]["verdict"] == "PASS" and (out / "soak" / "soak-report.json").is_file()
    assert doc["step_reports"]["soak"]["violations"] == [] and doc["step_reports"]["soak"]["cycles"] >= 3
    for step in ("run-golden", "warmup", "poc"):
        assert (out / f"{step}.trace.json").is_file() and (out / f"{step}.png").read_bytes()[:8] == PNG_MAGIC
        assert doc["step_reports"][step]["device"] == "mock"
    assert "calctl bringup" in r.out and "MOCK RESULT" in r.out


def test_bringup_single_package_skips_the_poc_and_a_bad_package_skips_the_rest(
    cli: Cli, tmp_path: Path, copy_fixture: CopyFixture
) -> None:
    r = cli(
        "bringup",
        FIXTURE_PACKAGES / "single",
        *TRUST,
        "--level",
        "quick",
        "--report",
        tmp_path / "a",
        "--format",
        "json",
    )
    assert r.code == 0, r.err
    summary = {s["step"]: s for s in r.json["summary"]}
    assert summary["poc"]["verdict"] == "SKIP" and "does not apply" in summary["poc"]["detail"]
    assert summary["warmup"]["verdict"] in ("PASS", "WARN")

    bad = copy_fixture("combined")
    (bad / "model-b" / "golden" / "expected_tokens.npy").write_bytes(b"not the sealed bytes")
    r = cli("bringup", bad, *TRUST, "--report", tmp_path / "b", "--format", "json")
    assert r.code == 1
    summary = {s["step"]: s for s in r.json["summary"]}
    assert summary["validate"]["verdict"] == "FAIL"
    for step in ("budget", "run-golden", "warmup", "poc", "soak"):  # reported, never silently dropped
        assert summary[step]["verdict"] == "SKIP" and summary[step]["detail"].startswith("skipped: needs")
    assert r.json["verdict"] == "FAIL" and (tmp_path / "b" / "report.json").is_file()
    shutil.rmtree(bad)


def test_junit_has_one_testcase_per_step(cli: Cli, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    plan = _plan(tmp_path, "corrupt", "{kind: corrupt_output, job: 3, graph: model_b_decode, magnitude: 8.0}")
    r = cli("run-golden", FIXTURE_PACKAGES / "combined", *TRUST, "--fault-plan", plan, "--format", "junit")
    assert r.code == 1
    root = ET.fromstring(r.out)
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "calctl.run-golden"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert "golden model-a" in cases and cases["golden model-a"].find("failure") is None
    failure = cases["golden model-b"].find("failure")
    assert failure is not None and "model-b: decode[2]" in (failure.get("message") or "")
    assert root.get("failures") == "1"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["device"] == "mock" and props["mock_result"] == "true" and props["verdict"] == "FAIL"


def test_sigterm_stops_bringup_interrupted_with_its_report(tmp_path: Path) -> None:
    """Issue 21: SIGTERM (timeout, CI) is handled like Ctrl-C: the step is INTERRUPTED, the rest SKIP, exit 130."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "bringup"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calctl", "bringup", str(FIXTURE_PACKAGES / "combined"), *TRUST, "--report", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:

        def device_steps_started() -> bool:
            assert proc.poll() is None, proc.communicate()
            return (out / "run-golden.png").is_file()

        wait_until(device_steps_started, what="bringup to reach its device steps", timeout=120, interval=0.05)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    doc = json.loads((out / "report.json").read_text())
    summary = {s["step"]: s for s in doc["summary"]}
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130
    cut = [s for s in summary.values() if s["verdict"] == "INTERRUPTED"]
    if cut:  # the signal came in a step: that step is INTERRUPTED, naming it
        assert len(cut) == 1 and "SIGTERM" in cut[0]["detail"]
    else:  # it came between two steps, or inside a garbage-collector callback, which drops the raise: the step
        # ends and the pipeline stops at the next boundary (errors.signal_unraised); the report names where
        assert doc["error"].startswith("interrupted (SIGTERM) after "), doc["error"]
        assert any(s["verdict"] == "SKIP" and "interrupted (SIGTERM)" in s["detail"] for s in summary.values())
    assert "SIGTERM" in doc["error"]
    assert summary["soak"]["verdict"] in ("SKIP", "INTERRUPTED")
    assert "verdict INTERRUPTED" in stdout


@pytest.mark.parametrize(
    "command", [["bringup"], ["run-golden"], ["warmup"], ["poc", "combined"], ["soak"], ["accept"]]
)
def test_a_missing_package_is_a_usage_error_before_any_step(cli: Cli, tmp_path: Path, command: list[str]) -> None:
    """Bring-up said ERROR, exit 3 (a device error) with an empty step detail for a path that does not exist."""
    missing = tmp_path / "no-such-package"
    extra = {"run-golden": [], "soak": ["--cycles", "1", "--report", tmp_path / "r"]}.get(
        command[0], ["--report", tmp_path / "r"]
    )
    r = cli(*command, missing, *extra)
    assert_no_traceback(r)
    assert r.code == 2 and f"{missing}: no such file or directory" in r.err, (r.code, r.err)
