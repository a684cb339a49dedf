"""Model B's TTFT and ``/health/live`` while model A receives the largest allowed body (issue 49, 001 §9.2).

Run on demand::

    python benchmarks/bench_big_body.py [--samples 300] [--rounds 5] [--kind both|text|ids] [--max-body-mb 4]

It starts one ``calctl serve`` on the mock board (the combined sample package: model-a on
chip 0, model-b on chip 1) and measures, in the same run, for each kind of body:

1. **idle**: ``--samples`` streamed 2-token requests to model B (time to the first SSE
   chunk that carries text, TTFT) and as many ``GET /health/live`` round trips, in
   ``--rounds`` parts alternating with the next phase (the shared host's load drifts);
2. **beside A's big body**: the same, while another process sends model A request
   bodies of the largest allowed size back to back (``text``: one prompt string, the
   tokenizer's worst case; ``ids``: a prompt of about a million token ids, the JSON
   parser's), so the server is always reading, parsing or tokenizing one of them. The
   sender is its own process so that its work never holds the measuring client's
   interpreter lock.

It prints P50 and P99 of each and the ratio of P99s against the issue's acceptance
(within 2x), with the load average, since the host is shared. A's bodies are
answered 400 (far past the 256-token context): that is the point.

Mock results: they measure calctl's HTTP layer around a simulated device; they say nothing
about what a Calculet board can do (SPEC §9).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fixtures" / "packages" / "combined"
TRUSTED = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"
TARGET_RATIO = 2.0
WORDS = "calculet board prefill decode lanes chips tokens stream "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(max_body_mb: float) -> Iterator[str]:
    port = _free_port()
    cmd = [
        *(sys.executable, "-m", "calctl", "serve", str(PACKAGE), "--trusted-key", str(TRUSTED)),
        *("--port", str(port), "--warmup-iterations", "1", "--log-level", "warning"),
        *("--max-body-mb", str(max_body_mb)),
    ]
    # cwd: ``python -m calctl`` imports the working directory's calctl before PYTHONPATH's, so a bench started
    # from another checkout would measure that checkout's server.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"calctl serve exited with {proc.returncode} before it was ready")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise SystemExit("calctl serve was not ready within 180 s")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def big_body(limit: int, kind: str) -> bytes:
    """A completions body for model A of exactly ``limit`` bytes."""
    head = b'{"model": "model-a", "max_tokens": 4, "prompt": '
    if kind == "text":
        room = limit - len(head) - 3
        text = (WORDS * (room // len(WORDS) + 1))[:room]
        body = head + b'"' + text.encode() + b'"}'
    else:
        ids = ",".join(str(5 + i % 300) for i in range(limit // 3))
        body = head + b"[" + ids.encode()[: limit - len(head) - 3].rstrip(b",") + b"]}"
        body += b" " * (limit - len(body))  # whitespace pads the JSON to the limit
    assert len(body) == limit, (len(body), limit)
    return body


def ttft_ms(client: httpx.Client, url: str) -> float:
    body = {"model": "model-b", "prompt": "Hi", "max_tokens": 2, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line:
                return (time.perf_counter() - start) * 1000
    raise RuntimeError("model B's stream ended without text")


def live_ms(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    r = client.get(f"{url}/health/live")
    r.raise_for_status()
    return (time.perf_counter() - start) * 1000


def measure(url: str, samples: int) -> tuple[list[float], list[float]]:
    ttft, live = [], []
    with httpx.Client(timeout=120) as client:
        for _ in range(samples):
            ttft.append(ttft_ms(client, url))
            live.append(live_ms(client, url))
            time.sleep(0.02)
    return ttft, live


def _send_a(url: str, body: bytes, stop: Any, results: Any) -> None:
    """The other process: model A's ``body`` back to back until ``stop``; (seconds, status) of each on ``results``."""
    seconds, statuses = [], []
    with httpx.Client(timeout=300) as client:
        while not stop.is_set():
            start = time.perf_counter()
            r = client.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json"})
            seconds.append(time.perf_counter() - start)
            statuses.append(r.status_code)
    results.put((seconds, statuses))


def _beside_a(
    url: str, body: bytes, samples: int, a_seconds: list[float], a_status: list[int]
) -> tuple[list[float], list[float]]:
    """B's figures while another process sends model A ``body`` back to back."""
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    sender = ctx.Process(target=_send_a, args=(url, body, stop, results), daemon=True)
    sender.start()
    time.sleep(1.0)  # the sender's interpreter started and A's first body is being read or processed
    try:
        return measure(url, samples)
    finally:
        stop.set()
        seconds, statuses = results.get(timeout=300)
        sender.join(60)
        a_seconds += seconds
        a_status += statuses


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


def _run_kind(url: str, kind: str, limit: int, samples: int, rounds: int) -> dict[str, Any]:
    """Idle and beside-A figures for one kind of body, ``rounds`` alternating parts; printed, and returned."""
    body = big_body(limit, kind)
    idle_ttft: list[float] = []
    idle_live: list[float] = []
    busy_ttft: list[float] = []
    busy_live: list[float] = []
    a_seconds: list[float] = []
    a_status: list[int] = []
    per_round = max(2, samples // rounds)
    before = os.getloadavg()
    # Idle and busy alternate, so a change in the shared host's load lands in both.
    for _ in range(rounds):
        ttft, live = measure(url, per_round)
        idle_ttft += ttft
        idle_live += live
        ttft, live = _beside_a(url, body, per_round, a_seconds, a_status)
        busy_ttft += ttft
        busy_live += live
    load = os.getloadavg()
    if not a_seconds:
        raise SystemExit("model A was never answered while B was measured")
    print(
        f"\nA's body: {limit} bytes ({kind}), {len(a_seconds)} sent, answers {sorted(set(a_status))}, "
        f"{statistics.median(a_seconds):.3f} s median each; {len(idle_ttft)} samples each over {rounds} rounds"
    )
    print(f"{'':28}{'idle P50':>10}{'P99':>10}{'beside A P50':>14}{'P99':>10}{'P99 ratio':>11}  target")
    ratios = {}
    for name, key, idle, busy in (
        ("model B TTFT (ms)", "ttft", idle_ttft, busy_ttft),
        ("/health/live (ms)", "live", idle_live, busy_live),
    ):
        ratios[key] = p99(busy) / p99(idle)
        print(
            f"{name:28}{statistics.median(idle):10.2f}{p99(idle):10.2f}"
            f"{statistics.median(busy):14.2f}{p99(busy):10.2f}{ratios[key]:10.2f}x  <= {TARGET_RATIO:g}x"
        )
    print(f"load average {before[0]:.2f} at the start, {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    return {
        "kind": kind,
        "rounds": rounds,
        "samples": len(idle_ttft),
        "a_bodies": len(a_seconds),
        "ttft_p99_ratio": round(ratios["ttft"], 3),
        "live_p99_ratio": round(ratios["live"], 3),
        "ttft_p50_ms": [round(statistics.median(idle_ttft), 2), round(statistics.median(busy_ttft), 2)],
        "load1": [round(before[0], 2), round(load[0], 2)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=300, help="B requests per phase, over all rounds")
    ap.add_argument("--kind", choices=("both", "text", "ids"), default="both")
    ap.add_argument("--max-body-mb", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=5, help="idle/busy rounds, alternating (at least 5 for a verdict)")
    args = ap.parse_args()
    limit = int(args.max_body_mb * 2**20)
    kinds = ("text", "ids") if args.kind == "both" else (args.kind,)
    with _server(args.max_body_mb) as url:
        measure(url, 5)  # warm the connection and the engine
        print(f"mock board (a simulated device: not hardware evidence); A's bodies of {limit} bytes")
        results = [_run_kind(url, kind, limit, args.samples, args.rounds) for kind in kinds]
    worst = max(max(r["ttft_p99_ratio"], r["live_p99_ratio"]) for r in results)
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    print(f"\nworst P99 ratio {worst:.2f}x: {verdict} the {TARGET_RATIO:g}x target")
    print(json.dumps({"worst_p99_ratio": worst, "kinds": results}))


if __name__ == "__main__":
    main()
