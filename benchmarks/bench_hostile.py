"""Benchmark: how fast each hostile package of issue 30 is refused, and at what peak memory.

Run on demand (not part of the test suite; a few minutes on a quiet machine)::

    python benchmarks/bench_hostile.py [--only NAME ...]

Builds each attack in a temporary directory, runs ``calctl validate ATTACK
--format json`` in a fresh interpreter that reports its own wall time (from
entering ``main``, so Python's start-up on a loaded host is not counted) and its
peak RSS (``VmHWM`` from ``/proc/self/status``: ``ru_maxrss`` of a child keeps
the parent's high-water mark across exec on Linux), and prints one row per
attack with the LAY/MAN/HASH/ELF finding that refused it. The targets (issue
30): refused in under 5 s and under 300 MB RSS. A second table sends SIGINT to
long cases that the (raised) limits allow and prints the time from the signal to
the exit (target: under 1 s, exit 130).

The unit tests assert the limits' figures (tests/unit/validate/test_validate_costs.py,
test_validate_streams_and_trees.py); this script measures and asserts nothing.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import io
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "packages" / "single"

_MEASURED = """
import sys, time
t0 = time.monotonic()
from calctl.cli.app import main
code = main(sys.argv[1:])
sys.stdout.flush()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"MEASURED seconds={time.monotonic() - t0:.3f} rss_kb={hwm}", file=sys.stderr)
sys.exit(code)
"""

_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": lambda b: gzip.compress(b, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _tar(members: list[tuple[str, bytes]], mode: Literal["w", "w:xz"] = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _bomb(kind: str, header: bytes, gib: int) -> bytes:
    block = _COMPRESS[kind](bytes(64 * 1024**2))
    return _COMPRESS[kind](header) + block * (gib * 16)


def build(tmp: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        out[name] = tmp / name
        out[name].write_bytes(data)

    for kind in ("gz", "bz2", "xz"):
        empty = _COMPRESS[kind](b"")
        put(f"empty-streams.tar.{kind}", empty * (12_000_000 // len(empty)))
        put(f"declares-16GiB.tar.{kind}", _bomb(kind, _header("pkg/blob.bin", 16 * 1024**3), 16))
    put("pax-1GiB.tar.bz2", _bomb("bz2", _header("././@PaxHeader", 1024**3, tarfile.XHDTYPE), 1))
    record = b"6 x=y\n"
    payload = record * ((1024 * 1024 - 1000) // len(record))
    pax = bytearray()
    for i in range(64):
        header = tarfile.TarInfo("././@PaxHeader")
        header.type = tarfile.XHDTYPE
        header.size = len(payload)
        pax += header.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (-len(payload) % 512)
        pax += tarfile.TarInfo(f"pkg/f{i}").tobuf(format=tarfile.USTAR_FORMAT)
    put("pax-records.tar.bz2", bz2.compress(bytes(pax) + b"\0" * 1024))
    compat = tmp / "compat-1M-bad"
    shutil.copytree(FIXTURE, compat)
    doc = json.loads((compat / "compatibility.json").read_text())
    doc["device"]["kinds"] = ["\x01bad"] * 1_000_000
    (compat / "compatibility.json").write_text(json.dumps(doc))
    out["compat-1M-bad"] = compat
    names = ["pkg/" + "/".join(f"d{i}_{k}" for k in range(51)) + "/f" for i in range(9_999)]
    put("deep-52.tar.xz", _tar([(n, b"") for n in names], "w:xz"))
    names = ["pkg/" + "/".join(f"d{i}_{k}" for k in range(20)) + "/f" for i in range(9_999)]
    put("deep-20.tar.xz", _tar([(n, b"") for n in names], "w:xz"))
    put("flat-9999.tar.xz", _tar([(f"pkg/f{i}", b"") for i in range(9_999)], "w:xz"))
    manifest = tmp / "yaml-flow"
    shutil.copytree(FIXTURE, manifest)
    (manifest / "manifest.yaml").write_text("flows: [" + ",".join(["1"] * 2_000_000) + "]\n")
    out["manifest-2M-nodes"] = manifest
    checks = tmp / "checksums-100k"
    shutil.copytree(FIXTURE, checks)
    lines = "".join(f"{'0' * 64}  missing/{i:06d}.bin\n" for i in range(100_000))
    (checks / "checksums.sha256").write_text((checks / "checksums.sha256").read_text() + lines)
    out["checksums-100k"] = checks
    return out


def measure(target: Path) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CALCTL_TRUSTED_KEYS", None)
    r = subprocess.run(
        [sys.executable, "-c", _MEASURED, "validate", str(target), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = next(x for x in r.stderr.splitlines() if x.startswith("MEASURED"))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    try:
        doc = json.loads(r.stdout)
        first = next(c for c in doc["checks"] if c["status"] in ("fail", "error"))
        why = f"{first['id']}: {first['message'][:110]}"
    except (ValueError, StopIteration):
        why = f"exit {r.returncode}: {r.stderr[-110:]}"
    return float(fields["seconds"]), int(fields["rss_kb"]) / 1024, why


def sigint(args: list[str], prelude: str, wait_s: float = 3.0) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = prelude + "\nfrom calctl.cli.app import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    time.sleep(wait_s)
    if proc.poll() is not None:
        return -1.0, proc.returncode
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    proc.communicate(timeout=120)
    return time.monotonic() - t0, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="attack names to run (default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as d:
        tmp = Path(d)
        attacks = build(tmp)
        print(f"{'attack':<26} {'size':>10} {'seconds':>8} {'RSS MB':>7}  refused by")
        for name, target in attacks.items():
            if args.only and name not in args.only:
                continue
            size = target.stat().st_size if target.is_file() else sum(p.stat().st_size for p in target.rglob("*"))
            seconds, rss, why = measure(target)
            print(f"{name:<26} {size:>10} {seconds:>8.2f} {rss:>7.0f}  {why}")
        big = attacks["declares-16GiB.tar.bz2"]
        raised = "import calctl.package.archive as a\na.MAX_EXPANSION = 10**9\n"
        seconds, code = sigint(["validate", str(big)], raised)
        print(f"SIGINT during a 16 GiB bz2 extraction (limits raised): {seconds:.2f} s to exit, exit {code}")
        flow = attacks["manifest-2M-nodes"]
        raised = "import calctl.package.yamlsafe as y\ny.MAX_NODES = 10**9\ny.MAX_PARSE_SECONDS = 1e9\n"
        seconds, code = sigint(["validate", str(flow)], raised)
        print(f"SIGINT during a 2M-node YAML parse (limits raised): {seconds:.2f} s to exit, exit {code}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
