"""The serving hot path against the device's own job times, for sync, async and ping/pong (issue 15).

Run on demand::

    python benchmarks/bench_serve.py [--requests 30] [--max-tokens 32] [--saturation-s 6] [--streams 6]

It starts one ``calctl serve`` on the mock board (the combined sample package, mock
timing defaults: prefill about 4 ms + 0.05 ms/token, decode about 3.2 ms) with a
``calculet-dual-model/v1`` configuration that allows two jobs in flight per chip,
and drives it with an OpenAI-compatible streaming client (SSE over httpx, one
event per delta). For each executor mode, set through the admin API
(``POST /internal/models/{alias}/executor``), it measures:

1. **TTFT - device prefill, 1 request in flight, P50**: the client's time to the
   first text delta minus the prefill job's own device interval (start -> end);
2. **TPOT - device decode, 1 request in flight, P50**: the client's time per
   output token after the first, minus the mean device interval of that
   request's decode jobs;
3. **ITL P99 / device decode step, 1 request in flight**: the P99 of the gaps
   between text deltas over the median device decode interval;
4. **chip busy / wall under saturation, per chip, both models**: the union of
   the chip's job intervals over the measuring window, with ``--streams``
   concurrent streams per model.

Device intervals come from the board itself (``GET /internal/trace``, the mock's
per-chip trace, CLOCK_MONOTONIC like the client's clock), not from the engine.
Every figure is printed next to its device time and the issue's target.

Mock results: they measure calctl's own overhead around a simulated device; they
say nothing about what a Calculet board can do (SPEC §9).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fixtures" / "packages" / "combined"
TRUSTED = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"
ADMIN = "bench-admin"
MODES = ("sync", "async", "pingpong")
ALIASES = ("model-a", "model-b")
CHIP_OF = {"model-a": 0, "model-b": 1}

TARGETS = {
    "ttft_overhead_ms": 2.0,
    "tpot_overhead_ms": 0.3,
    "itl_p99_over_decode": 3.0,
    "busy_over_wall": 0.95,
}


def _config(path: Path) -> None:
    model = textwrap.dedent("""\
          - alias: {alias}
            chip_id: {chip}
            prefill_graph: {graph}_prefill
            decode_graph: {graph}_decode
            context_limit: 256
            max_inflight: 2
            max_waiting_requests: 64
            scheduler:
              admission: {{max_waiting_requests: 64, max_waiting_prompt_tokens: 262144, deadline_default_ms: 120000}}
              queues: {{decode_weight: 8, short_prefill_weight: 4, medium_prefill_weight: 2, long_prefill_weight: 1,
                        short_prefill_max_tokens: 512, medium_prefill_max_tokens: 4096}}
              batch: {{profiles: [1], batching_window_us: 0}}
              executor: {{max_inflight: 2, fixed_engine: false, mode: sync}}
              recovery: {{max_resets_per_10min: 2, restart_on_unknown_dma: true}}
        """)
    body = "".join(model.format(alias=a, chip=CHIP_OF[a], graph=a.replace("-", "_")) for a in ALIASES)
    path.write_text(
        "schema: calculet-dual-model/v1\n"
        f"device: {{type: pcie, expected_chips: 2, combined_calbin: {PACKAGE}}}\n"
        "models:\n"
        + textwrap.indent(body, "")
        + "recovery: {allow_session_reset: false, restart_process_on_unknown_dma: true}\n"
    )


@contextlib.contextmanager
def serve(tmp: Path, port: int, time_scale: float) -> Iterator[str]:
    cfg = tmp / "dual.yaml"
    _config(cfg)
    log = tmp / "serve.log"
    cmd = [
        sys.executable, "-m", "calctl", "serve", str(PACKAGE), "--trusted-key", str(TRUSTED), "--config", str(cfg),
        "--port", str(port), "--admin-key", ADMIN, "--log-level", "warning", "--time-scale", str(time_scale),
    ]  # fmt: skip
    env = {**os.environ, "CALCTL_CACHE_DIR": str(tmp / "cache")}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"calctl serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > end:
                raise SystemExit(f"calctl serve not ready in 120 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Stream:
    alias: str
    sent_ns: int
    deltas_ns: list[int] = field(default_factory=list)
    tokens_at: list[int] = field(default_factory=list)  # completion tokens covered up to each delta
    end_ns: int = 0
    completion_tokens: int = 0
    finish: str | None = None


def stream_once(client: httpx.Client, url: str, alias: str, max_tokens: int) -> Stream:
    body = {
        "model": alias,
        "prompt": "The quick brown fox jumps over the lazy dog",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        # Usage on every chunk: a delta can cover several tokens (a character split across byte tokens is
        # held until complete), and the figures are per token.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    s = Stream(alias, time.monotonic_ns())
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"{alias}: HTTP {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            doc = json.loads(data)
            if doc.get("usage"):
                s.completion_tokens = doc["usage"]["completion_tokens"]
            for c in doc.get("choices", ()):
                if c.get("text"):
                    s.deltas_ns.append(time.monotonic_ns())
                    s.tokens_at.append(doc["usage"]["completion_tokens"])
                if c.get("finish_reason"):
                    s.finish = c["finish_reason"]
    s.end_ns = time.monotonic_ns()
    return s


def trace(client: httpx.Client, url: str, since_ns: int) -> list[dict]:
    doc = client.get(
        f"{url}/internal/trace", params={"since_ns": since_ns}, headers={"Authorization": f"Bearer {ADMIN}"}
    ).json()
    if doc.get("device") != "mock":
        raise SystemExit(f"the trace came from {doc.get('device')!r}, expected the mock board")
    return [e for e in doc["events"] if e["start_ns"] is not None and e["end_ns"] is not None]


def set_mode(client: httpx.Client, url: str, mode: str) -> None:
    for alias in ALIASES:
        r = client.post(
            f"{url}/internal/models/{alias}/executor", json={"mode": mode}, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        if r.status_code != 200 or not r.json().get("ok"):
            raise SystemExit(f"{alias}: executor mode {mode}: {r.status_code} {r.text[:300]}")


def pct(values: list[float], q: float) -> float:
    vs = sorted(values)
    if not vs:
        return float("nan")
    k = (len(vs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(vs) - 1)
    return vs[lo] + (vs[hi] - vs[lo]) * (k - lo)


@dataclass
class Single:
    ttft_overhead_ms: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    tpot_overhead_ms: list[float] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    held_first: int = 0  # requests whose first token was part of a character (no TTFT sample)
    # Where the host time goes (from the device's own timestamps, the client's clock):
    send_to_submit_ms: list[float] = field(default_factory=list)  # HTTP, parse, tokenize, admit, schedule, launch
    submit_to_start_ms: list[float] = field(default_factory=list)  # the board's own dispatch (mock chip thread)
    end_to_delta_ms: list[float] = field(default_factory=list)  # completion, sample, deliver, SSE, client
    end_to_next_submit_ms: list[float] = field(default_factory=list)  # decode: completion -> next job submitted


def one_in_flight(client: httpx.Client, url: str, n: int, max_tokens: int) -> Single:
    out = Single()
    for i in range(n):
        alias = ALIASES[i % 2]
        s = stream_once(client, url, alias, max_tokens)
        jobs = [e for e in trace(client, url, s.sent_ns) if e["model"] == alias and e["submit_ns"] <= s.end_ns]
        prefill = [e for e in jobs if "prefill" in e["graph"]]
        decode = [e for e in jobs if "decode" in e["graph"]]
        if len(prefill) != 1 or not s.deltas_ns:
            raise SystemExit(f"request {i}: {len(prefill)} prefill jobs in its window, {len(s.deltas_ns)} deltas")
        p_ms = (prefill[0]["end_ns"] - prefill[0]["start_ns"]) / 1e6
        out.prefill_ms.append(p_ms)
        if s.tokens_at[0] == 1:  # the first token was text on its own: its delta time is the TTFT
            out.ttft_overhead_ms.append((s.deltas_ns[0] - s.sent_ns) / 1e6 - p_ms)
            pf = prefill[0]
            out.send_to_submit_ms.append((pf["submit_ns"] - s.sent_ns) / 1e6)
            out.submit_to_start_ms.append((pf["start_ns"] - pf["submit_ns"]) / 1e6)
            out.end_to_delta_ms.append((s.deltas_ns[0] - pf["end_ns"]) / 1e6)
        else:
            out.held_first += 1
        if not decode or len(s.deltas_ns) < 2 or s.tokens_at[-1] <= s.tokens_at[0]:
            continue
        d = [(e["end_ns"] - e["start_ns"]) / 1e6 for e in decode]
        out.decode_ms.extend(d)
        steps = sorted(prefill + decode, key=lambda e: e["submit_ns"])
        out.end_to_next_submit_ms.extend((b["submit_ns"] - a["end_ns"]) / 1e6 for a, b in itertools.pairwise(steps))
        out.submit_to_start_ms.extend((e["start_ns"] - e["submit_ns"]) / 1e6 for e in decode)
        tpot = (s.deltas_ns[-1] - s.deltas_ns[0]) / 1e6 / (s.tokens_at[-1] - s.tokens_at[0])
        out.tpot_overhead_ms.append(tpot - statistics.fmean(d))
        for k in range(1, len(s.deltas_ns)):  # inter-token latency: consecutive deltas one token apart
            if s.tokens_at[k] - s.tokens_at[k - 1] == 1:
                out.itl_ms.append((s.deltas_ns[k] - s.deltas_ns[k - 1]) / 1e6)
    return out


def busy_fraction(events: list[dict], chip: int, t0: int, t1: int) -> float:
    spans = sorted((max(e["start_ns"], t0), min(e["end_ns"], t1)) for e in events if e["chip"] == chip)
    busy, cur_s, cur_e = 0, None, None
    for s, e in spans:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / (t1 - t0)


def saturation(url: str, seconds: float, streams: int, max_tokens: int) -> dict[int, float]:
    stop = threading.Event()
    errors: list[str] = []

    def client_loop(alias: str) -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                try:
                    stream_once(c, url, alias, max_tokens)
                except (httpx.HTTPError, SystemExit) as exc:
                    errors.append(f"{alias}: {exc}")
                    return

    threads = [threading.Thread(target=client_loop, args=(a,), daemon=True) for a in ALIASES for _ in range(streams)]
    for t in threads:
        t.start()
    time.sleep(min(2.0, seconds / 3))  # ramp: every stream started
    t0 = time.monotonic_ns()
    events: list[dict] = []
    with httpx.Client(timeout=30) as c:
        since = t0 - 5_000_000_000  # jobs that started before the window count from its start
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            fresh = trace(c, url, since)
            seen = {e["job"] for e in events}
            events.extend(e for e in fresh if e["job"] not in seen)
        t1 = time.monotonic_ns()
        events.extend(e for e in trace(c, url, since) if e["job"] not in {x["job"] for x in events})
    stop.set()
    for t in threads:
        t.join(90)
    if errors:
        raise SystemExit(f"saturation clients failed: {errors[:3]}")
    return {chip: busy_fraction(events, chip, t0, t1) for chip in (0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=30, help="sequential requests per mode (1 in flight)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--saturation-s", type=float, default=6.0)
    ap.add_argument("--streams", type=int, default=6, help="concurrent streams per model under saturation")
    ap.add_argument("--time-scale", type=float, default=1.0, help="mock time scale (1.0: the issue's defaults)")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    port = args.port
    if port == 0:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp, serve(Path(tmp), port, args.time_scale) as url:
        with httpx.Client(timeout=60) as client:
            set_mode(client, url, "sync")
            one_in_flight(client, url, 4, args.max_tokens)  # warm the server's paths
            for mode in MODES:
                set_mode(client, url, mode)
                single = one_in_flight(client, url, args.requests, args.max_tokens)
                busy = saturation(url, args.saturation_s, args.streams, args.max_tokens)
                decode_step = statistics.median(single.decode_ms)
                results[mode] = {
                    "device_prefill_ms_p50": statistics.median(single.prefill_ms),
                    "device_decode_ms_p50": decode_step,
                    "ttft_overhead_ms_p50": statistics.median(single.ttft_overhead_ms),
                    "tpot_overhead_ms_p50": statistics.median(single.tpot_overhead_ms),
                    "itl_ms_p99": pct(single.itl_ms, 0.99),
                    "itl_p99_over_decode": pct(single.itl_ms, 0.99) / decode_step,
                    "chip0_busy_over_wall": busy[0],
                    "chip1_busy_over_wall": busy[1],
                    "ttft_send_to_submit_ms_p50": statistics.median(single.send_to_submit_ms),
                    "submit_to_start_ms_p50": statistics.median(single.submit_to_start_ms),
                    "ttft_end_to_delta_ms_p50": statistics.median(single.end_to_delta_ms),
                    "decode_end_to_next_submit_ms_p50": statistics.median(single.end_to_next_submit_ms),
                    "requests": float(args.requests),
                    "ttft_samples": float(len(single.ttft_overhead_ms)),
                    "itl_samples": float(len(single.itl_ms)),
                }
    print(
        f"bench_serve: calctl serve on the MOCK board (mock results, not hardware evidence), time scale {args.time_scale:g}"
    )
    print(
        f"{args.requests} sequential requests x {args.max_tokens} tokens per mode; saturation {args.streams} streams/model"
    )
    head = f"{'figure':<44}{'target':>10}" + "".join(f"{m:>12}" for m in MODES)
    print(head)
    print("-" * len(head))
    rows = [
        ("device prefill P50 (ms)", None, "device_prefill_ms_p50", ".2f"),
        ("device decode step P50 (ms)", None, "device_decode_ms_p50", ".2f"),
        ("TTFT - device prefill, P50 (ms)", "<= 2", "ttft_overhead_ms_p50", ".2f"),
        ("  as a ratio to device prefill", None, None, ".2f"),
        ("TPOT - device decode, P50 (ms)", "<= 0.3", "tpot_overhead_ms_p50", ".2f"),
        ("  as a ratio to device decode", None, None, ".2f"),
        ("  TTFT samples (first token a whole char)", None, "ttft_samples", ".0f"),
        ("ITL P99 (ms)", None, "itl_ms_p99", ".2f"),
        ("  ITL samples (one token apart)", None, "itl_samples", ".0f"),
        ("ITL P99 / device decode step", "<= 3", "itl_p99_over_decode", ".2f"),
        ("where it goes, P50 (ms): send -> prefill submit", None, "ttft_send_to_submit_ms_p50", ".2f"),
        ("  job submit -> device start (board)", None, "submit_to_start_ms_p50", ".2f"),
        ("  prefill end -> first delta at client", None, "ttft_end_to_delta_ms_p50", ".2f"),
        ("  job end -> next job submitted", None, "decode_end_to_next_submit_ms_p50", ".2f"),
        ("chip0 busy / wall, saturation", ">= 0.95", "chip0_busy_over_wall", ".3f"),
        ("chip1 busy / wall, saturation", ">= 0.95", "chip1_busy_over_wall", ".3f"),
    ]
    for label, target, key, fmt in rows:
        cells = []
        for m in MODES:
            r = results[m]
            if key is None and "prefill" in label:
                v = r["ttft_overhead_ms_p50"] / r["device_prefill_ms_p50"]
            elif key is None:
                v = r["tpot_overhead_ms_p50"] / r["device_decode_ms_p50"]
            else:
                v = r[key]
            cells.append(f"{v:>12{fmt}}")
        print(f"{label:<44}{target or '':>10}" + "".join(cells))
    if args.json:
        args.json.write_text(
            json.dumps({"mock_result": True, "time_scale": args.time_scale, "modes": results}, indent=2)
        )


if __name__ == "__main__":
    main()
