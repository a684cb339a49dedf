"""``calctl serve`` as a process: SIGTERM/SIGINT drain before the socket closes, exit codes 0 and 4 (issue 11).

Each test starts one real ``python -m calctl serve`` on loopback (mock board),
holds a long streaming request open on it (or signals it while it loads), and
signals the process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.integration.multiboard_harness import (
    COMBINED,
    REPO,
    TEST_PUB,
    Backend,
    Outcome,
    boards,
    free_port,
    one_request,
    stop_process,
)
from tests.waiting import log_tail, wait_until

TIME_SCALE = 4.0  # ~12 ms of mock device time per token


def _start_stream(board: Backend, max_tokens: int) -> tuple[threading.Thread, list[Outcome]]:
    """A streaming request to ``board``; returns once the board has answered 200 (accepted it)."""
    out: list[Outcome] = []
    accepted = threading.Event()
    status: list[int] = []

    class _Signalling(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            status.append(response.status_code)
            accepted.set()
            return response

    def run() -> None:
        with httpx.Client(transport=_Signalling(), timeout=httpx.Timeout(60.0, connect=5.0)) as client:
            out.append(one_request(client, board.url, 1, "model-a", True, max_tokens))
        accepted.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert accepted.wait(30) and status == [200], f"the stream was not accepted: {status} {out and out[0].detail}"
    return t, out


def _wait_ready_503(board: Backend) -> httpx.Response:
    """``/health/ready`` once it says 503: the drain began (the signal handler runs within a tick)."""

    def draining() -> httpx.Response | None:
        r = httpx.get(f"{board.url}/health/ready", timeout=5)
        return r if r.status_code == 503 else None

    return wait_until(draining, what=f"{board.board}'s /health/ready to say 503", timeout=5, interval=0.02)


def test_sigterm_keeps_serving_accepted_stream_then_exits_0(tmp_path: Path) -> None:
    with boards(
        tmp_path, [("solo", 3)], time_scale=TIME_SCALE, drain_timeout=20, extra_args=("--drain-grace", "1.0")
    ) as (b,):
        # ~2.4 s of device time: the stream, then the grace, keep the socket open long enough for this process to
        # see the 503 even when a loaded host does not schedule it for a second or two after the signal.
        stream, out = _start_stream(b, max_tokens=200)
        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        ready = _wait_ready_503(b)
        live = httpx.get(f"{b.url}/health/live", timeout=5)
        late = httpx.post(
            f"{b.url}/v1/completions", json={"model": "model-b", "prompt": "late", "max_tokens": 2}, timeout=5
        )
        code = b.proc.wait(30)
        elapsed = time.monotonic() - t0
        stream.join(10)
    assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
    assert live.status_code == 200
    assert late.status_code == 503 and late.headers.get("retry-after") and "shutting down" in late.text
    assert out and out[0].complete and out[0].ended - out[0].started > 0.2, out and out[0].detail
    assert code == 0, b.log_text()[-2000:]
    assert elapsed >= 1.0  # --drain-grace holds the socket open even after the stream finished
    assert "SIGTERM: drained in" in b.log_text()


def test_sigint_at_the_drain_deadline_exits_4_and_says_so(tmp_path: Path) -> None:
    with boards(tmp_path, [("solo", 3)], time_scale=TIME_SCALE, drain_timeout=1.0) as (b,):
        stream, out = _start_stream(b, max_tokens=200)  # ~3 s of device time: longer than the deadline
        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGINT)
        code = b.proc.wait(30)
        elapsed = time.monotonic() - t0
        stream.join(10)
    log = b.log_text()
    assert code == 4, log[-2000:]
    assert "SIGINT: the drain deadline (--drain-timeout 1 s) closed the server" in log
    assert elapsed < 1.0 + 4.0  # deadline + flush + board release, far less than the stream would have taken
    assert out and not out[0].complete  # the cut stream has no [DONE]: the client can tell


def test_a_second_signal_stops_waiting(tmp_path: Path) -> None:
    with boards(tmp_path, [("solo", 3)], time_scale=TIME_SCALE, drain_timeout=30) as (b,):
        stream, _out = _start_stream(b, max_tokens=200)
        b.proc.send_signal(signal.SIGTERM)
        assert _wait_ready_503(b).status_code == 503
        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        code = b.proc.wait(30)
        elapsed = time.monotonic() - t0
        stream.join(10)
    assert code == 4 and "a second signal closed the server" in b.log_text()
    assert elapsed < 4.0


def test_sigterm_while_loading_releases_the_board_and_exits_130(tmp_path: Path) -> None:
    """Before it listens (golden + warm-up) there is nothing to drain: SIGTERM unwinds like Ctrl-C."""
    log = tmp_path / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "calctl",
        "serve",
        str(COMBINED),
        "--trusted-key",
        str(TEST_PUB),
        "--port",
        str(free_port()),
        "--time-scale",
        "20",
        "--warmup-iterations",
        "500",
        "--log-level",
        "info",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    try:

        def warming() -> bool:
            assert proc.poll() is None, log_tail(log, 2000)
            return "-> Warming" in log.read_text(errors="replace")

        wait_until(
            warming,
            what="the server to start warming up",
            timeout=60,
            interval=0.05,
            detail=lambda: log_tail(log, 2000),
        )
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        elapsed = time.monotonic() - t0
    finally:
        stop_process(proc, signal.SIGKILL, timeout=5)
    text = log.read_text(errors="replace")
    assert code == 130, text[-2000:]  # interrupted (docs/cli.md), not killed by the signal (-15)
    assert "Traceback" not in text
    assert "model-a -> Failed golden/warmup failed" in text  # the load unwound: configuration reset, board closed
    assert elapsed < 10


def test_a_reset_that_fails_is_failed_from_the_cli_fault_plan(tmp_path: Path) -> None:
    """Issue 29 item 3: the Failed path of 001 §11.3 row 6 from the command line, no monkeypatching: ``calctl
    serve --fault-plan`` with a CCU fault on A and ``reset_failure`` on every reset. The board reset fails,
    the device-level board reset fails too, and /health/ready names both aliases Failed with the reason."""
    plan = tmp_path / "faults.yaml"
    plan.write_text(
        "schema: calctl-fault-plan/v1\n"
        "faults:\n"
        "  - {kind: ccu_exception, job: 60, graph: model_a_decode}\n"
        "  - {kind: reset_failure, probability: 1}\n"
    )
    with boards(tmp_path, [("solo", 3)], time_scale=0.2, drain_timeout=10, extra_args=("--fault-plan", str(plan))) as (
        b,
    ):
        with httpx.Client(timeout=30) as c:
            for _ in range(60):  # model-a traffic until its 60th decode job faults and the recovery ends
                ready = c.get(f"{b.url}/health/ready")
                if ready.status_code == 503 and len(ready.json().get("failed", {})) == 2:
                    break
                one_request(c, b.url, 1, "model-a", False, 8)
    failed = ready.json()["failed"]
    assert set(failed) == {"model-a", "model-b"}, ready.json()
    assert all("board reset failed" in r and "device-level board reset failed too" in r for r in failed.values())
    assert "injected reset_failure" in failed["model-b"], failed
