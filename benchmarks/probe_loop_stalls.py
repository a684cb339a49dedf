"""Where ``calctl serve``'s event loop stalls while model A receives the largest bodies (issue 49, 001 §9.2).

Run on demand::

    python benchmarks/probe_loop_stalls.py [--kind ids|text] [--seconds 20] [--max-body-mb 4]

``bench_big_body.py`` measures what a client sees (B's TTFT, ``/health/live``), which
swings with the shared host's load. This probe looks inside the server instead, with
figures that depend on the host's load far less:

* every callback the event loop runs is timed in wall time **and in the loop thread's
  own CPU time** (``time.thread_time``): a callback that burns CPU on the loop is a stall
  whatever the load; one whose wall time is far above its CPU time waited (for the
  interpreter lock, or for a core);
* a task that sleeps 1 ms in a loop measures the loop's lag (what ``/health/live`` waits);
* a thread that sleeps 1 ms in a loop measures how long a Python thread waits for the
  interpreter lock (plus the host's scheduling);
* a watchdog thread samples the loop thread's Python stack when one callback has run
  for more than ``--stack-after-ms``, so a stall is named by its code.

The server runs with the standard library's asyncio loop (uvloop's callbacks cannot be
timed one by one); the code the callbacks run is the same. Phases: idle (model B's
2-token requests and ``/health/live`` only), then beside A (the same while another
process sends A's bodies back to back). Mock board: a simulated device, no hardware
evidence.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


# -- inside the server process ----------------------------------------------------------------------------


class _Probe:
    def __init__(self, stack_after_s: float, out: Path) -> None:
        self.stack_after_s = stack_after_s
        self.out = out
        self.loop_thread = threading.get_ident()
        self.reset()
        self._current: tuple[float, Any] | None = None  # (start, handle) of the callback running now

    def reset(self) -> None:
        self.calls: list[tuple[float, float, str]] = []  # (wall, cpu, what) of callbacks over 0.5 ms wall or cpu
        self.ncalls = 0
        self.cpu_total = 0.0
        self.loop_lag: list[float] = []
        self.gil_wait: list[float] = []
        self.stacks: collections.Counter[str] = collections.Counter()
        self.started = time.monotonic()

    def snapshot(self, name: str) -> None:
        def top(values: list[float]) -> dict[str, float]:
            v = sorted(values)
            if not v:
                return {}
            return {
                "n": len(v),
                "p50_ms": v[len(v) // 2] * 1e3,
                "p99_ms": v[int(len(v) * 0.99)] * 1e3,
                "max_ms": v[-1] * 1e3,
            }

        slow = sorted(self.calls, reverse=True)
        by_cpu = sorted(self.calls, key=lambda c: c[1], reverse=True)
        doc = {
            "phase": name,
            "seconds": time.monotonic() - self.started,
            "callbacks": self.ncalls,
            "loop_cpu_s": self.cpu_total,
            "over_1ms_wall": sum(1 for w, _, _ in self.calls if w > 1e-3),
            "over_1ms_cpu": sum(1 for _, c, _ in self.calls if c > 1e-3),
            "max_wall_ms": slow[0][0] * 1e3 if slow else 0.0,
            "max_cpu_ms": by_cpu[0][1] * 1e3 if by_cpu else 0.0,
            "top_wall": [(round(w * 1e3, 2), round(c * 1e3, 2), what) for w, c, what in slow[:8]],
            "top_cpu": [(round(w * 1e3, 2), round(c * 1e3, 2), what) for w, c, what in by_cpu[:8]],
            "loop_lag": top(self.loop_lag),
            "gil_wait": top(self.gil_wait),
            "stacks": self.stacks.most_common(6),
        }
        with self.out.open("a") as f:
            f.write(json.dumps(doc) + "\n")
        self.reset()

    def install(self) -> None:
        import asyncio.events

        import uvicorn

        probe = self
        run = asyncio.events.Handle._run

        def timed(handle: Any) -> None:
            w0, c0 = time.perf_counter(), time.thread_time()
            probe._current = (w0, handle)
            try:
                run(handle)
            finally:
                probe._current = None
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                probe.ncalls += 1
                probe.cpu_total += cpu
                if wall > 5e-4 or cpu > 5e-4:
                    probe.calls.append((wall, cpu, _describe(handle)))

        setattr(asyncio.events.Handle, "_run", timed)  # noqa: B010 - the probe replaces the method
        config_init = uvicorn.Config.__init__

        def asyncio_loop(self: Any, *args: Any, **kw: Any) -> None:
            kw["loop"] = "asyncio"
            config_init(self, *args, **kw)

        uvicorn.Config.__init__ = asyncio_loop  # type: ignore[method-assign]
        startup = uvicorn.Server.startup

        async def with_lag_task(server: Any, sockets: Any = None) -> None:
            probe.loop_thread = threading.get_ident()
            asyncio.get_running_loop().create_task(probe.lag())
            await startup(server, sockets=sockets)

        setattr(uvicorn.Server, "startup", with_lag_task)  # noqa: B010 - the probe replaces the method
        threading.Thread(target=self.gil, daemon=True, name="probe-gil").start()
        threading.Thread(target=self.watch, daemon=True, name="probe-watch").start()
        signal.signal(signal.SIGUSR1, lambda *_: self.snapshot(os.environ.get("PROBE_PHASE", "?")))

    async def lag(self) -> None:
        import asyncio

        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.loop_lag.append(time.perf_counter() - t - 0.001)

    def gil(self) -> None:
        while True:
            t = time.perf_counter()
            time.sleep(0.001)
            self.gil_wait.append(time.perf_counter() - t - 0.001)

    def watch(self) -> None:
        seen: Any = None
        while True:
            time.sleep(self.stack_after_s / 2)
            current = self._current
            if current is None or current[1] is seen or time.perf_counter() - current[0] < self.stack_after_s:
                continue
            seen = current[1]
            frame = sys._current_frames().get(self.loop_thread)
            if frame is not None:
                lines = traceback.format_stack(frame)[-4:]
                self.stacks[" | ".join(line.strip().splitlines()[0] for line in lines)] += 1


def _describe(handle: Any) -> str:
    cb = getattr(handle, "_callback", None)
    owner = getattr(cb, "__self__", None)
    if owner is not None and hasattr(owner, "get_coro"):
        coro = owner.get_coro()
        # Where the task stopped after this step: the innermost coroutine it awaits, and its line.
        inner = coro
        while getattr(inner, "cr_await", None) is not None and hasattr(inner.cr_await, "cr_frame"):
            inner = inner.cr_await
        frame = getattr(inner, "cr_frame", None)
        at = f" @ {Path(frame.f_code.co_filename).name}:{frame.f_lineno} {inner.__qualname__}" if frame else ""
        return f"task {getattr(coro, '__qualname__', coro)}{at}"
    return getattr(cb, "__qualname__", repr(cb))[:120]


def _serve_with_probe(argv: list[str]) -> None:
    out = Path(os.environ["PROBE_OUT"])
    _Probe(float(os.environ.get("PROBE_STACK_AFTER_S", "0.002")), out).install()
    from calctl.cli import run

    sys.argv = ["calctl", *argv]
    run()


# -- the driver ---------------------------------------------------------------------------------------------


def main() -> None:

    import bench_big_body as bb

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("ids", "text"), default="ids")
    ap.add_argument("--seconds", type=float, default=20.0, help="of each phase")
    ap.add_argument("--max-body-mb", type=float, default=4.0)
    ap.add_argument("--stack-after-ms", type=float, default=2.0)
    args = ap.parse_args()
    out = Path(f"/tmp/probe-loop-stalls-{os.getpid()}.ndjson")
    port = bb._free_port()
    cmd = [
        *(sys.executable, __file__, "--in-server", "serve", str(bb.PACKAGE), "--trusted-key", str(bb.TRUSTED)),
        *("--port", str(port), "--warmup-iterations", "1", "--log-level", "warning", "--audit-interval", "0"),
        *("--max-body-mb", str(args.max_body_mb)),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE_OUT": str(out)}
    env["PROBE_STACK_AFTER_S"] = str(args.stack_after_ms / 1e3)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _up(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the probed server did not start")
            time.sleep(0.2)
        bb.measure(url, 5)
        body = bb.big_body(int(args.max_body_mb * 2**20), args.kind)
        load = [os.getloadavg()[0]]
        for phase in ("idle", "beside A"):
            os.kill(proc.pid, signal.SIGUSR1)  # drop what start-up and the last phase left
            time.sleep(0.2)
            if phase == "idle":
                _for(url, args.seconds)
            else:
                _beside(url, body, args.seconds)
            with open(out, "a") as f:
                f.write(json.dumps({"phase_end": phase}) + "\n")
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.5)
            load.append(os.getloadavg()[0])
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        if proc.poll() is None:
            proc.kill()
    _print(out, args.kind, load)


def _up(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _for(url: str, seconds: float) -> None:
    import bench_big_body as bb
    import httpx

    end = time.monotonic() + seconds
    with httpx.Client(timeout=120) as client:
        while time.monotonic() < end:
            bb.ttft_ms(client, url)
            bb.live_ms(client, url)
            time.sleep(0.02)


def _beside(url: str, body: bytes, seconds: float) -> None:
    import bench_big_body as bb

    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    sender = ctx.Process(target=bb._send_a, args=(url, body, stop, results), daemon=True)
    sender.start()
    time.sleep(1.0)
    try:
        _for(url, seconds)
    finally:
        stop.set()
        _seconds, statuses = results.get(timeout=300)
        sender.join(60)
        print(f"A: {len(statuses)} bodies, answers {sorted(set(statuses))}")


def _print(out: Path, kind: str, load: list[float]) -> None:
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    phases = [d for d in docs if "callbacks" in d]
    names = [d["phase_end"] for d in docs if "phase_end" in d]
    # Each phase's snapshot is the one written after its "phase_end" marker.
    snaps = []
    for i, d in enumerate(docs):
        if "phase_end" in d:
            snaps.append(next(p for p in docs[i + 1 :] if "callbacks" in p))
    print(f"\n{kind} bodies; load average {', '.join(f'{x:.2f}' for x in load)} (start, after each phase)")
    for name, s in zip(names, snaps, strict=True):
        print(f"\n== {name}: {s['callbacks']} callbacks in {s['seconds']:.1f} s, loop CPU {s['loop_cpu_s']:.2f} s")
        print(f"   callbacks over 1 ms: wall {s['over_1ms_wall']}, CPU {s['over_1ms_cpu']}; ", end="")
        print(f"max wall {s['max_wall_ms']:.2f} ms, max CPU {s['max_cpu_ms']:.2f} ms")
        for key in ("loop_lag", "gil_wait"):
            v = s[key]
            if v:
                print(f"   {key}: p50 {v['p50_ms']:.2f} p99 {v['p99_ms']:.2f} max {v['max_ms']:.2f} ms (n={v['n']})")
        print("   top by CPU (wall ms, cpu ms, callback):")
        for row in s["top_cpu"][:6]:
            print(f"     {row}")
        print("   top by wall:")
        for row in s["top_wall"][:6]:
            print(f"     {row}")
        for stack, n in s["stacks"]:
            print(f"   stack x{n}: {stack}")
    del phases
    print(json.dumps({"kind": kind, "load1": load, "phases": dict(zip(names, snaps, strict=True))}))


def gil_holds(kind: str, bodies_n: int, limit: int) -> None:
    """In this process: a worker thread refuses ``bodies_n`` bodies of A as the server's threads do (the
    guard's join, the byte scan, the parse), while this thread asks for the interpreter lock every 0.1 ms;
    prints how long it waited, at most and at P99 (the GIL holds of those threads, plus the host's
    scheduling: the least of three runs is printed)."""
    import bench_big_body as bb

    from calctl.serving.api import bodies, guard
    from calctl.serving.api.schemas import CompletionRequest

    body = bb.big_body(limit, kind)
    parts = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    join = getattr(guard, "join_parts", b"".join)

    def work() -> None:
        for _ in range(bodies_n):
            raw = join(parts)
            with contextlib.suppress(bodies.Refused):
                bodies.refuse_long_ids(raw, lambda _: 256)
                bodies.parse_body(raw, CompletionRequest, lambda _: 256)

    runs = []
    for _ in range(3):
        gaps: list[float] = []
        worker = threading.Thread(target=work)
        worker.start()
        while worker.is_alive():
            t = time.perf_counter()
            time.sleep(0.0001)
            gaps.append(time.perf_counter() - t - 0.0001)
        gaps.sort()
        runs.append((gaps[-1] * 1e3, gaps[int(len(gaps) * 0.99)] * 1e3, len(gaps)))
    best = min(runs)
    print(f"{kind}: lock waits beside {bodies_n} bodies: max {best[0]:.2f} ms, P99 {best[1]:.3f} ms (n={best[2]})")
    print(f"  all runs (max ms, P99 ms, n): {[(round(a, 2), round(b, 3), c) for a, b, c in runs]}")
    print(f"  load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--gil":
        gil_holds(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30, 4 * 2**20)
    elif len(sys.argv) > 1 and sys.argv[1] == "--in-server":
        _serve_with_probe(sys.argv[2:])
    else:
        main()
