"""Two boards behind nginx vs one board, same workload, on the mock (issue 11).

Run on demand (needs nginx: ``apt-get install nginx``)::

    python benchmarks/bench_multiboard.py [--time-scale 8] [--concurrency 16] [--max-tokens 24] [--seconds 30]

Both runs send the same request mix (same prompts, greedy sampling, half of
them streaming, alternating the two models) from the same number of client
threads, each sending its next request when the last one is answered:

1. **one board**: one ``calctl serve`` (mock board ``board-a``), clients talk
   to it directly;
2. **two boards**: ``board-a`` and ``board-b`` behind nginx running the
   configuration of docs/deploy.md §3.

Throughput is the completion tokens of the requests that finished inside a
``--seconds`` window opened ``--ramp`` seconds after the load started (so
neither the simultaneous start nor the drained tail counts), per second. The
ratio two/one is the figure of merit (target >= 1.8). The mock's ``--time-scale`` stretches modelled device time so that it,
not the CPU cost of HTTP, nginx and the engine, bounds throughput, as on a real
board; the CPU columns (what the client, the serve processes and nginx used, as a
share of all cores, and how busy the whole machine was; from /proc) shows how much headroom the machine had. With too small a time
scale, two boards on a 2-core machine are CPU-bound and the ratio says nothing
about boards.

Mock results: they show that one process per board behind nginx scales; they
say nothing about what a Calculet board can do (SPEC §8).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.multiboard_harness import LoadClient, Outcome, boards, find_nginx, nginx_front


@dataclass
class RunResult:
    name: str
    requests: int
    tokens: int
    seconds: float
    cpu_seconds: float  # CPU used by the client, the serve processes and nginx during the run
    machine_busy: float  # 0..1 of all cores, everything on the machine (other work included)
    failed: int

    @property
    def cpu_share(self) -> float:
        """Our CPU as a share of all cores over the run's wall time."""
        return self.cpu_seconds / (self.seconds * (os.cpu_count() or 1))

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


def _tree_cpu_seconds(roots: list[int]) -> float:
    """utime + stime of ``roots`` and all their descendants (this process included by the caller), from /proc."""
    stats: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2 :].split()  # fields after "(comm)": state ppid ... utime(12) stime(13)
        stats[int(entry.name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tick)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(child for child, (ppid, _) in stats.items() if ppid == pid)
    return total


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies over all cores, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def run_load(name: str, base: str, args: argparse.Namespace, pids: list[int]) -> RunResult:
    """Closed loop at ``--concurrency``; count what completes in the window after the ramp-up (no ramp, no tail)."""
    LoadClient(base, workers=min(4, args.concurrency), max_tokens=4, max_requests=8, max_seconds=60).start().join(120)
    roots = [os.getpid(), *pids]
    load = LoadClient(
        base,
        workers=args.concurrency,
        max_tokens=args.max_tokens,
        max_requests=100_000,
        max_seconds=args.ramp + args.seconds,
    ).start()
    time.sleep(args.ramp)
    cpu0, (busy0, total0) = _tree_cpu_seconds(roots), _cpu_times()
    w0 = time.time()
    time.sleep(args.seconds)
    w1 = time.time()
    cpu1, (busy1, total1) = _tree_cpu_seconds(roots), _cpu_times()
    results: list[Outcome] = load.stop(timeout=120)
    window = [o for o in results if w0 <= o.ended < w1]
    ok = [o for o in window if o.complete]
    return RunResult(
        name,
        len(ok),
        sum(o.completion_tokens for o in ok),
        w1 - w0,
        cpu1 - cpu0,
        (busy1 - busy0) / max(total1 - total0, 1.0),
        len(results) - sum(o.complete for o in results),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--time-scale", type=float, default=8.0, help="mock device time multiplier (default 8: ~24 ms per decode step)"
    )
    p.add_argument(
        "--concurrency", type=int, default=16, help="client threads (default 16: enough to keep two boards busy)"
    )
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--ramp", type=float, default=5.0, help="seconds of load before the measured window")
    p.add_argument("--seconds", type=float, default=30.0, help="the measured window of each run")
    p.add_argument("--target", type=float, default=1.8, help="exit 1 when two/one is below this")
    args = p.parse_args(argv)
    nginx = find_nginx()
    if nginx is None:
        print("nginx is not installed (apt-get install nginx)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-multiboard-") as tmp:
        work = Path(tmp)
        with boards(work, [("board-a", 1)], time_scale=args.time_scale, drain_timeout=30) as (a,):
            one = run_load("one board, direct", a.url, args, [a.proc.pid])
        with boards(work, [("board-a", 1), ("board-b", 2)], time_scale=args.time_scale, drain_timeout=30) as pair:
            with nginx_front(pair, nginx) as front:
                two = run_load("two boards, nginx", front.url, args, [b.proc.pid for b in pair] + [front.proc.pid])
                split = [b.requests_finished() for b in pair]
    print(
        f"mock boards, time scale {args.time_scale:g}, {args.concurrency} client threads, requests of {args.max_tokens} "
        f"tokens (half streaming, both models); counted: completions in a {args.seconds:g} s window after {args.ramp:g} s"
    )
    print(
        f"{'run':<20} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'req/s':>7} {'our CPU':>8} "
        f"{'machine':>8} {'failed':>6}"
    )
    for r in (one, two):
        print(
            f"{r.name:<20} {r.requests:>8} {r.tokens:>7} {r.seconds:>8.2f} {r.tokens_per_s:>9.1f} {r.requests_per_s:>7.2f} "
            f"{r.cpu_share:>8.0%} {r.machine_busy:>8.0%} {r.failed:>6}"
        )
    print(
        f"our CPU: client + serve processes + nginx, share of {os.cpu_count()} cores; machine: all cores busy, "
        "other work included"
    )
    if not one.tokens or not two.tokens:
        print("a run completed no request: no ratio", file=sys.stderr)
        return 1
    ratio = two.tokens_per_s / one.tokens_per_s
    print(f"requests finished per board behind nginx (whole run): {', '.join(f'{n:g}' for n in split)}")
    print(f"throughput two/one: {ratio:.2f}x (target >= {args.target:g}x)")
    return 0 if ratio >= args.target and not one.failed and not two.failed else 1


if __name__ == "__main__":
    sys.exit(main())
