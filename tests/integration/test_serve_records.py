"""``calctl serve --records DIR``: 001 §14 per-request and per-job NDJSON records from a real server process.

The records are internal: they name the chips (model-a on chip0, model-b on chip1), which the public API
never does. One server (mock board, time scale 0.2), three requests, then the records are read back.
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

import httpx
import pytest

from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_PUB, Cli
from tests.waiting import wait_http_ready, wait_until

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(tmp: Path, *extra: str) -> Iterator[str]:
    port = _free_port()
    log_path = tmp / "serve.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server process writes it until the finally below
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "calctl", "serve", str(FIXTURE_PACKAGES / "combined"), "--trusted-key"),
            *(str(TEST_PUB), "--host", "127.0.0.1", "--port", str(port), "--time-scale", "0.2"),
            *("--warmup-iterations", "1", "--log-level", "warning", *extra),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(url, proc, log=log_path, timeout=60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _records(path: Path, want: int) -> list[dict[str, Any]]:
    """Wait (with a deadline) until ``want`` request records were written, then return every record."""
    docs: list[dict[str, Any]] = []

    def enough() -> bool:
        docs[:] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return sum(d["record"] == "request" for d in docs) >= want

    wait_until(enough, what=f"{want} request records in {path}", interval=0.05, detail=lambda: f"{len(docs)} records")
    return docs


def test_serve_writes_request_and_job_records(tmp_path: Path) -> None:
    rec_dir = tmp_path / "records"
    with _serve(tmp_path, "--records", str(rec_dir)) as url:
        for alias in ("model-a", "model-b"):
            body = {"model": alias, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
            assert "chip" not in r.text  # chip ids stay in the internal records
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": "model-a", "prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True},
            timeout=30,
        )
        assert r.status_code == 200
        docs = _records(rec_dir / "records.ndjson", 3)
    requests = [d for d in docs if d["record"] == "request"]
    jobs = [d for d in docs if d["record"] == "job"]
    by_alias = {d["model_alias"]: d for d in requests}
    a, b = by_alias["model-a"], by_alias["model-b"]
    assert a["chips"] == [0] and b["chips"] == [1]
    assert b["model_generation"] >= 1 and b["prompt_tokens"] > 0 and b["output_tokens"] == 4
    assert b["finish_reason"] == "length" and b["error_class"] is None
    assert 0 <= b["queue_ms"] <= b["ttft_ms"] <= b["e2e_ms"] and b["tpot_ms"] > 0
    b_jobs = [j for j in jobs if j["model_alias"] == "model-b"]
    assert [j["kind"] for j in b_jobs] == ["prefill", "decode", "decode", "decode"]
    for j in b_jobs:
        assert j["chips"] == [1] and j["output_status"] == "ok" and j["engine"] in ("auto", "ping", "pong")
        assert j["submit_ns"] < j["done_ns"] and j["device_ms"] > 0
        assert j["reset_generation"] is None  # a vendor gap: null, never 0
        assert j["kv_after"][0] >= j["kv_before"][0]
    assert b_jobs[0]["kv_before"] == [0] and b_jobs[0]["kv_after"] == [b["prompt_tokens"]]
    assert {k for j in jobs for k in j} >= {"h2d_ms", "infer_ms", "d2h_ms"}  # present, null when not reported


def test_records_into_a_plain_file_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    r = cli(
        "serve",
        FIXTURE_PACKAGES / "combined",
        "--trusted-key",
        TEST_PUB,
        "--port",
        str(_free_port()),
        "--records",
        target,
    )
    assert r.code == 2, r.err
    assert f"--records {target}: cannot write records there" in r.err and "Traceback" not in r.err


def test_metrics_is_internal_unless_the_operator_makes_it_public(tmp_path: Path) -> None:
    # With API keys and no admin key, /metrics (board and chip labels) is closed like /internal ...
    with _serve(tmp_path, "--api-key", "sk-a:team-a") as url:
        r = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer sk-a"}, timeout=10)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    # ... behind the admin key when there is one, and open only with --metrics-public.
    with _serve(tmp_path, "--api-key", "sk-a:team-a", "--admin-key", "adm", "--metrics-public") as url:
        assert "calctl_board_info" in httpx.get(f"{url}/metrics", timeout=10).text
        assert httpx.get(f"{url}/internal/trace", timeout=10).status_code == 401
