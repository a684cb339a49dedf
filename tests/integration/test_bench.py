"""Issue 9 acceptance: ``calctl bench`` against a real ``calctl serve`` process on loopback, and fault isolation.

Each server is ``python -m calctl serve`` on 127.0.0.1 with a free port, the
mock board at time scale 5 (about 15 ms of device time per decode token, so the
host's Python overhead does not dominate). The load saturates each model in
isolation (rate 4/s against a capacity of about 3/s at time scale 10), which is where a
serialising runtime shows: with ``--serialize-chips`` the joint run can only
deliver one chip's worth. Bounded: 5 s of arrivals per phase.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calctl.checks import host
from calctl.runners.bench import gates as G
from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_PUB, Cli, assert_no_traceback
from tests.waiting import wait_http_ready

pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LOAD = (
    "--models",
    "model-a,model-b",
    "--rate",
    "4",
    "--duration",
    "5",
    "--burstiness",
    "4",
    "--prompt-len",
    "16",
    "--output-len",
    "8",
    "--seed",
    "1",
    "--target-device",
    "mock",
    "--format",
    "json",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(tmp: Path, *extra: str) -> Iterator[str]:
    port = _free_port()
    log = open(tmp / f"serve-{port}.log", "wb")  # noqa: SIM115 - the server process writes it until the finally below
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "calctl",
            "serve",
            str(FIXTURE_PACKAGES / "combined"),
            "--trusted-key",
            str(TEST_PUB),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--time-scale",
            "10",
            "--warmup-iterations",
            "1",
            "--log-level",
            "info",  # a start that does not finish names the lifecycle step it stopped in
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # Generous: under 8 CPU burners and other work a start took over 60 s; a server that never gets ready still fails.
        wait_http_ready(url, proc, log=tmp / f"serve-{port}.log", timeout=180)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def parallel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve(tmp_path_factory.mktemp("serve")) as url:
        yield url


def _host_clock_gates_held(doc: dict[str, Any]) -> bool:
    """The bench found the host saturated (its own load samples): its wall-clock gates are NOT JUDGED, naming
    the load, and only the device-clock trace and B's success rate decide (docs/bench.md). True if so."""
    if not host.saturated(doc["host_load"]):
        return False
    for g in doc["gates"]:
        if g["name"].split("[")[0] in G.HOST_CLOCK_GATES:
            assert g["verdict"] == "NOT JUDGED" and ("host saturated" in g["detail"] or g["samples"] is not None), g
    return True


def test_mode_all_on_parallel_chips_has_efficiency_with_ci(cli: Cli, parallel_server: str, tmp_path: Path) -> None:
    r = cli("bench", "--url", parallel_server, "--mode", "all", *LOAD, "--report", tmp_path / "b")
    assert_no_traceback(r)
    doc = r.json
    eff, ovl = doc["throughput_efficiency"], doc["overlap_ratio"]
    assert eff["ci_low"] is not None and eff["ci_low"] <= eff["mean"] <= eff["ci_high"] and eff["n"] >= 5
    gates = {g["name"]: g for g in doc["gates"]}
    if not _host_clock_gates_held(doc):  # wall-clock figures are judged only on a host that was not saturated
        assert eff["mean"] >= 0.9, doc["gates"]
        assert ovl["ci_low"] > 0.3  # two chips in parallel: close to 0.5
        assert gates["throughput_efficiency"]["passed"] and gates["overlap_ratio"]["passed"]
    assert doc["verdict"] != "FAIL", doc["gates"]
    # 001 §1: the per-chip trace gates S2 too, read from the server's /internal/trace.
    trace = gates["per_chip_trace_overlap"]
    assert trace["passed"] is True and "per-chip trace (mock device" in trace["detail"], trace
    assert doc["per_chip_trace"]["device"] == "mock" and doc["per_chip_trace"]["both_busy_fraction"] >= 0.25
    assert {"p99_ttft_degradation[model-a]", "p99_tpot_degradation[model-b]", "b_success_rate"} <= set(gates)
    assert gates["b_success_rate"]["value"] == 1.0
    phases = doc["phases"]
    assert set(phases) == {"model-a isolated", "model-b isolated", "joint"}
    a_iso = phases["model-a isolated"]["stats"]
    assert a_iso["requests"] > 20
    if host.saturated(
        doc["host_load"]
    ):  # a load outcome (refused, deadline, client gave up) is the host's; never an error
        assert set(a_iso["outcomes"]) <= {"ok", "capacity", "unavailable", "deadline", "timeout"}, a_iso["outcomes"]
    else:
        assert a_iso["success_rate"] == 1.0, a_iso["outcomes"]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert 0 < a_iso[key]["p50"] <= a_iso[key]["p90"] <= a_iso[key]["p99"]
    assert a_iso["tokens_per_s"] > 0 and a_iso["requests_per_s"] > 0 and a_iso["saturated"] is True
    assert doc["mock_result"] is True and doc["device"] == "mock"
    assert (tmp_path / "b" / "bench.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "b" / "bench-report.json").read_text())["verdict"] == doc["verdict"]


def test_interference_pairs_and_goodput(cli: Cli, parallel_server: str, tmp_path: Path) -> None:
    r = cli(
        "bench",
        "--url",
        parallel_server,
        "--scenario",
        "interference",
        "--models",
        "model-a,model-b",
        "--rate",
        "3",
        "--burstiness",
        "8",
        "--duration",
        "0.6",
        "--slo-ttft",
        "0.5",
        "--slo-tpot",
        "0.5",
        "--format",
        "json",
        "--report",
        tmp_path / "i",
    )
    assert_no_traceback(r)
    assert r.code in (0, 1)  # the verdict depends on the host's jitter; the structure does not
    pairs = r.json["pairs"]
    assert [p["pair"] for p in pairs] == [
        "A prefill + B prefill",
        "A prefill + B decode",
        "A decode + B prefill",
        "A decode + B decode",
    ]
    gates = {g["name"]: g for g in r.json["gates"]}
    for p in pairs:
        assert p["verdict"] in ("PASS", "FAIL", "NOT JUDGED")
        # A loaded host can leave a pair without a steady-state window: its efficiency is then missing (None),
        # and the pair says NOT JUDGED with why, never a number that was not measured (issue 29 item 13).
        eff = p["comparison"]["throughput_efficiency"]["mean"]
        gate = gates[f"{p['pair']}: throughput_efficiency"]
        if eff is None:
            assert gate["verdict"] == "NOT JUDGED" and "steady-state" in gate["detail"], gate
            assert p["verdict"] != "PASS", p
        else:  # a loaded host can leave one window with no joint token: 0.0 measured, never judged PASS on it
            assert eff >= 0, p["comparison"]
            if p["comparison"]["throughput_efficiency"]["ci_low"] is None:
                assert gate["verdict"] != "PASS", gate
        for d in p["models"].values():
            assert d["isolated"]["requests"] > 0 and d["joint"]["goodput_rps"] is not None
            assert 0 <= d["joint"]["slo_attainment"] <= 1.0
    assert pairs[1]["models"]["model-a"]["watched"] == "ttft" and pairs[1]["models"]["model-b"]["watched"] == "tpot"
    assert pairs[1]["models"]["model-a"]["isolated"]["tpot_s"]["count"] == 0  # prefill-heavy: one token, no TPOT
    gate_names = {g["name"] for g in r.json["gates"]}
    assert "A prefill + B decode: p99_tpot_degradation[model-b]" in gate_names
    assert r.json["mock_result"] is None and "not stated" in r.json["note"]  # --target-device not given


def test_serialised_chips_fail_the_gates_and_say_which(cli: Cli, tmp_path: Path) -> None:
    with _serve(tmp_path, "--serialize-chips") as url:
        # Half the load of the parallel test: each phase runs until its requests are served, and one chip's
        # worth of service for two models fails the gates with a wide margin (measured 0.49 / -0.02).
        r = cli("bench", "--url", url, "--mode", "all", *LOAD, "--duration", "2.5", "--report", tmp_path / "s")
    assert_no_traceback(r)
    assert r.code == 1
    doc = r.json
    assert doc["verdict"] == "FAIL"
    failing = set(doc["failing_gates"])
    # The device's clock shows the chips taking turns, at any host load: the trace gate fails.
    assert "per_chip_trace_overlap" in failing and doc["per_chip_trace"]["both_busy_fraction"] < 0.25
    if not _host_clock_gates_held(doc):
        # One chip's worth of tokens for two models: efficiency near 0.5, overlap near 0 (measured 0.49, -0.02).
        assert "throughput_efficiency" in failing and doc["throughput_efficiency"]["mean"] < 0.7, doc["gates"]
        assert doc["overlap_ratio"]["mean"] < 0.15
    for name in failing:  # the report says which, on stderr too
        assert f"failing gate: {name}:" in r.err
    # About 10 requests per phase: a P99 is the slowest request, so the P99 gates are NOT JUDGED, never FAIL.
    gates = {g["name"]: g for g in doc["gates"]}
    for name in ("p99_ttft_degradation[model-a]", "p99_ttft_degradation[model-b]"):
        g = gates[name]
        assert g["passed"] is None and g["verdict"] == "NOT JUDGED" and g["samples"] < 100 == g["min_samples"]
        assert "--duration" in g["detail"] and f"not judged: {name}:" in r.err


def test_a_dataset_concurrency_sweep_gives_levels_a_knee_picture_and_json(
    cli: Cli, parallel_server: str, tmp_path: Path
) -> None:
    """Issue 49: prompts from a local file (text, token ids and a chat), a closed loop per concurrency level."""
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        '{"prompt": "The capital of France is", "max_tokens": 6}\n'
        '{"prompt": [5, 6, 7, 8], "max_tokens": 5}\n'
        '{"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}\n',
        encoding="utf-8",
    )
    out = tmp_path / "sweep"
    r = cli(
        "bench", "--url", parallel_server, "--models", "model-a", "--dataset", data, "--sweep", "concurrency",
        "--sweep-levels", "1,2,4", "--duration", "1.5", "--slo-ttft", "5", "--report", out, "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 0, r.err[-2000:]
    doc = r.json
    assert doc["scenario"] == "sweep" and doc["verdict"] == "MEASURED"
    assert doc["sweep"] == "concurrency" and doc["model"] == "model-a"
    assert doc["dataset"]["layout"] == "jsonl" and doc["dataset"]["entries"] == 3 and doc["dataset"]["chats"] == 1
    assert [lv["level"] for lv in doc["levels"]] == [1, 2, 4]
    for lv in doc["levels"]:
        assert lv["sent"] > 0 and lv["succeeded"] == lv["sent"], lv  # text, ids and the chat all served
        assert lv["tokens_per_s"] > 0 and lv["ttft_p50_s"] is not None
    assert set(doc["knee"]) == {"level", "reason"} and doc["knee"]["reason"]
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC


def test_bench_usage_errors(cli: Cli, tmp_path: Path) -> None:
    port = _free_port()
    for args, needle in (
        (("--mode", "all"), "--url is required"),
        (("--scenario", "nope"), "expected one of"),
        (("--url", f"http://127.0.0.1:{port}", "--models", "model-a,model-b"), "cannot reach"),
        (("--url", "http://127.0.0.1:1", "--prompt-len", "uniform:9:2"), "--prompt-len"),
        (("--scenario", "fault-isolation", "--url", "http://127.0.0.1:1"), "--url does not apply"),
        (("--scenario", "ab", "--sweep", "rate", "--url", "http://127.0.0.1:1"), "--sweep belongs to --scenario sweep"),
        (("--url", "http://127.0.0.1:1", "--sweep-levels", "1,2"), "--sweep-levels needs --sweep"),
        (("--url", "http://127.0.0.1:1", "--sweep", "concurrency", "--sweep-levels", "4,2"), "increasing"),
        (("--url", "http://127.0.0.1:1", "--dataset", str(tmp_path)), "not a regular file"),
    ):
        r = cli("bench", *args, "--report", tmp_path / "u")
        assert r.code == 2, (args, r.err)
        assert needle in r.err, r.err
        assert_no_traceback(r)


def test_sigterm_ends_a_bench_interrupted_with_its_report(tmp_path: Path) -> None:
    """Issue 21: SIGTERM is handled like SIGINT: verdict INTERRUPTED, exit 130, bench-report.json written."""
    import os
    import signal
    import sys

    out = tmp_path / "f"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calctl", "bench", "--scenario", "fault-isolation", "--report", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until the scenario has finished its first phase
            if "phase invalid-tensor" in line:
                break
        else:
            pytest.fail(f"the bench ended before its second phase ({proc.wait(30)})")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 130, stderr[-3000:]
    doc = json.loads((out / "bench-report.json").read_text())
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130 and doc["mock_result"] is True
    assert any("interrupted (SIGTERM)" in n for n in doc["notes"])
    assert "verdict INTERRUPTED" in stdout
    # Issue 29 item 12: the phase finished before the signal stays in the report, and the picture is drawn.
    assert doc["phases"][0]["phase"] == "baseline" and doc["phases"][0]["b_requests"] > 0
    assert doc["grade"] == "INTERRUPTED" and "finished phase(s) reported: baseline" in doc["grade_reason"]
    assert doc["phases_finished"][0] == "baseline" and doc["interrupted_in"] not in (None, "baseline")
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC and "plot: None" not in stdout


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_ab_keeps_its_finished_isolated_phase_and_its_picture(
    parallel_server: str, tmp_path: Path, sig: str
) -> None:
    """Issue 29 item 12: a signal during the ``ab`` scenario's second phase ends it INTERRUPTED (exit 130) with
    the isolated phase it had finished in bench-report.json (its requests and latencies) and bench.png written;
    nothing is judged (docs/cli.md, Signals)."""
    import signal

    out = tmp_path / "b"
    args = [a for a in LOAD if a not in ("--format", "json")]
    args[args.index("--duration") + 1] = "2"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "calctl",
            "bench",
            "--url",
            parallel_server,
            "--mode",
            "all",
            *args,
            "--report",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # A's isolated phase is over once B's starts
            seen.append(line)
            if "phase model-b isolated" in line:
                break
        else:
            pytest.fail(f"the bench ended before its second phase ({proc.wait(30)}): {''.join(seen)[-2000:]}")
        proc.send_signal(getattr(signal, sig))
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    doc = json.loads((out / "bench-report.json").read_text())
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130 and doc["gates"] == []
    a_iso = doc["phases"]["model-a isolated"]["stats"]
    assert a_iso["requests"] > 0 and a_iso["succeeded"] > 0, a_iso
    assert "joint" not in doc["phases"] and doc["interrupted_in"] == "model-b isolated"
    assert doc["phases_finished"] == ["model-a isolated"]
    assert any(f"interrupted ({sig}" in n and "finished phase(s) reported: model-a isolated" in n for n in doc["notes"])
    assert doc["files"]["plot"] == str(out / "bench.png")
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC
    assert "plot: None" not in stdout and "verdict INTERRUPTED" in stdout
    assert "model-a" in stdout  # the finished phase's table is printed
