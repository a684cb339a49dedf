"""Two boards behind a real nginx: load spreads over both, one board drains on SIGTERM mid-load (issue 11).

Two ``calctl serve`` processes (mock boards ``board-a`` and ``board-b``, seeds 11
and 22) listen on loopback behind nginx running the configuration block of
docs/deploy.md §3 unchanged but for ports. Six client threads send streaming
and non-streaming completions for both models through nginx; then board-a gets
SIGTERM while requests are in flight on it.

What "started" means here, precisely:

* **accepted**: a board answered 200 for the request (it passed validation and
  admission there; for a stream, the client's first byte is that 200). An
  accepted request must complete on that board: 200 with a whole JSON result,
  or an SSE stream ending in ``[DONE]`` with a finish reason and no error event.
* **never accepted**: a board answered 503 with ``Retry-After`` (it was
  draining) or the connection failed before any response. Only these may fail
  or be retried; the documented nginx configuration retries them on the other
  board (``proxy_next_upstream error timeout http_503 non_idempotent``), so the
  clients must see no failure at all, and the 503s show up only in nginx's log
  as an attempt on board-a followed by a 200 from board-b.

Bounded: at most 400 requests and 90 s of load, loopback only; every process
is stopped (and its process group killed if need be) on every path.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.integration.multiboard_harness import (
    Backend,
    LoadClient,
    Outcome,
    boards,
    find_nginx,
    nginx_front,
    one_request,
)
from tests.waiting import wait_until

NGINX = find_nginx()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        NGINX is None, reason="nginx is not installed (.ci/run installs Debian's nginx package when missing)"
    ),
]

TIME_SCALE = 4.0  # a 12-token request takes ~0.2-0.5 s of mock device time: requests overlap the SIGTERM
DRAIN_TIMEOUT = 20.0
MAX_TOKENS = 12
# The direct request that keeps board-a draining long enough to look at its health endpoints: ~2.4 s of device time,
# so a loaded host that schedules the test a second or two late still finds board-a draining, not closed.
LONG_TOKENS = 200


def _final_upstream(record: dict[str, str]) -> tuple[str, str]:
    """(address, status) of the last attempt nginx made for a request ("a, b" lists every attempt)."""
    return record["upstream_addr"].split(",")[-1].strip(), record["upstream_status"].split(",")[-1].strip()


def test_two_boards_behind_nginx_one_drains_on_sigterm_mid_load(tmp_path: Path) -> None:
    assert NGINX is not None
    with boards(tmp_path, [("board-a", 11), ("board-b", 22)], time_scale=TIME_SCALE, drain_timeout=DRAIN_TIMEOUT) as (
        a,
        b,
    ):
        with nginx_front([a, b], NGINX) as front:
            load = LoadClient(front.url, workers=6, max_tokens=MAX_TOKENS, max_requests=400, max_seconds=90).start()
            try:
                # Both boards take part before anything happens.
                wait_until(
                    lambda: a.requests_finished() >= 4 and b.requests_finished() >= 4,
                    what="both boards to serve",
                    timeout=60,
                    interval=0.05,
                )
                metrics_a = a.metrics()
                direct_public = [
                    httpx.get(a.url + path, timeout=5).text for path in ("/health/ready", "/health/live", "/v1/models")
                ]

                # A long stream accepted directly by board-a: board-a is certainly mid-request at SIGTERM.
                long_result: list[Outcome] = []
                accepted = threading.Event()
                long_thread = threading.Thread(target=_long_stream, args=(a, long_result, accepted), daemon=True)
                long_thread.start()
                assert accepted.wait(30), "board-a never accepted the long stream"
                wait_until(
                    lambda: a.live_requests() >= 3,
                    what="board-a to hold requests from nginx besides the long stream",
                    timeout=20,
                    interval=0.05,
                )

                t_signal = time.time()
                t0 = time.monotonic()
                a.proc.terminate()  # SIGTERM
                draining = _observe_drain(a)
                exit_code = a.proc.wait(DRAIN_TIMEOUT + 10)
                drain_seconds = time.monotonic() - t0
                t_exit = time.time()
                long_thread.join(30)

                # board-b keeps serving after board-a is gone.
                after = load.completed()
                wait_until(
                    lambda: load.completed() >= after + 8,
                    what="board-b to keep serving after board-a exited",
                    timeout=60,
                    interval=0.05,
                )
            finally:
                results = load.stop()
            public = [front.url + "/v1/models", front.url + "/metrics", front.url + "/health/ready"]
            public_answers = {url: httpx.get(url, timeout=5) for url in public}
            records = front.access_records()
            metrics_b = b.metrics()
            nginx_errors = front.error_log()

    log_a = a.log_text()
    retried = [r for r in records if "," in r["upstream_status"]]
    print(
        f"\n{len(results)} requests; drain {drain_seconds:.2f} s; attempts retried by nginx: "
        f"{Counter(r['upstream_status'] for r in retried)}"
    )

    # -- the SIGTERMed board drained and left cleanly --------------------------------------------
    assert exit_code == 0, f"board-a exited {exit_code}:\n{log_a[-3000:]}"
    assert drain_seconds < DRAIN_TIMEOUT, f"board-a took {drain_seconds:.1f} s to drain (deadline {DRAIN_TIMEOUT} s)"
    assert "SIGTERM: drained in" in log_a, log_a[-2000:]
    assert draining["ready"] == 503 and draining["ready_body"] == {"status": "draining"}, draining
    assert draining["live"] == 200, draining
    assert draining["new_request"] == 503 and draining["retry_after"], draining
    assert long_result and long_result[0].complete, long_result and long_result[0].detail
    assert long_result[0].ended > t_signal, "the long stream was meant to be in flight at SIGTERM"

    # -- the clients: no request failed (every never-accepted attempt was retried on board-b) ----
    failed = [o for o in results if not o.complete]
    assert not failed, (
        "\n".join(f"#{o.index} {o.model} stream={o.stream}: {o.detail}" for o in failed[:10])
        + f"\nnginx error log:\n{nginx_errors[-2000:]}"
    )
    assert len(results) >= 20
    assert {(o.model, o.stream) for o in results} == {(m, s) for m in ("model-a", "model-b") for s in (False, True)}

    # -- nginx's view: both boards served; requests accepted by board-a before SIGTERM finished there --
    by_id = {r["request_id"]: r for r in records if r["uri"] == "/v1/completions" and r["request_id"] not in ("", "-")}
    final = Counter(_final_upstream(r) for r in by_id.values())
    assert final[(a.address, "200")] >= 1 and final[(b.address, "200")] >= 1, final
    spanning = [
        o
        for o in results
        if o.started < t_signal < o.ended
        and o.request_id in by_id
        and _final_upstream(by_id[o.request_id])[0] == a.address
    ]
    assert spanning, "no request through nginx was in flight on board-a at SIGTERM: the test did not test the drain"
    assert all(o.complete for o in spanning)
    print(f"{len(spanning)} requests through nginx were in flight on board-a at SIGTERM and finished there")
    for r in records:  # an attempt on board-a that failed was never the last word
        attempts = [s.strip() for s in r["upstream_status"].split(",")]
        assert attempts[-1] == "200" or r["uri"] != "/v1/completions", r
    after_exit = [o for o in results if o.started > t_exit]
    assert len(after_exit) >= 8 and all(o.complete and o.request_id in by_id for o in after_exit)
    assert {_final_upstream(by_id[str(o.request_id)])[0] for o in after_exit} == {b.address}

    # -- board identity: internal metrics only, never on public answers -----------------------------
    assert 'calctl_board_info{board="board-a",device="mock"} 1.0' in metrics_a
    assert 'calctl_board_info{board="board-b",device="mock"} 1.0' in metrics_b
    assert public_answers[front.url + "/metrics"].status_code == 404  # /metrics is not proxied
    assert public_answers[front.url + "/health/ready"].status_code == 404
    assert public_answers[front.url + "/v1/models"].status_code == 200
    for text in [o.public_text for o in results] + [r.text for r in public_answers.values()] + direct_public:
        assert "board-a" not in text and "board-b" not in text, text[:500]


def _long_stream(board: Backend, out: list[Outcome], accepted: threading.Event) -> None:
    """A streaming request straight to ``board``; ``accepted`` is set when its 200 arrives (admitted there)."""

    class _Signalling(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if response.status_code == 200:
                accepted.set()
            return response

    with httpx.Client(transport=_Signalling(), timeout=httpx.Timeout(60.0, connect=5.0)) as client:
        out.append(one_request(client, board.url, 10_000, "model-a", True, LONG_TOKENS))
    accepted.set()  # also on failure, so the test does not wait for nothing


def _observe_drain(board: Backend) -> dict[str, object]:
    """Health and a new request on ``board`` right after SIGTERM (the long stream keeps it draining)."""
    with httpx.Client(timeout=5) as client:

        def draining() -> httpx.Response | None:
            r = client.get(f"{board.url}/health/ready")
            return r if r.status_code == 503 else None

        # The signal handler runs within a tick of the event loop.
        ready = wait_until(draining, what=f"{board.board}'s /health/ready to say 503", timeout=5, interval=0.02)
        live = client.get(f"{board.url}/health/live")
        new = client.post(f"{board.url}/v1/completions", json={"model": "model-b", "prompt": "late", "max_tokens": 2})
    return {
        "ready": ready.status_code,
        "ready_body": ready.json(),
        "live": live.status_code,
        "new_request": new.status_code,
        "retry_after": new.headers.get("retry-after"),
    }
