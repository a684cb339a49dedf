"""Benchmark: how long `calctl --version` and `calctl --help` take to start, against `python -c pass`.

Run on demand (not part of the test suite)::

    python benchmarks/bench_cli_startup.py [--runs 15]

Times, interleaved in the same run so machine load hits every command alike,
``--runs`` child processes each of:

* ``python -c pass`` (the interpreter's own start: the baseline),
* ``python -m calctl --version`` (answered before Typer is imported),
* ``python -m calctl --help`` (Typer + rich, no command module imported),
* ``python -m calctl validate --help`` (one command module), and the ``--help`` of
  ``rules``, ``budget`` and ``bringup``.

It prints the median and minimum wall time of each, the median minus the
baseline, the ratio to the baseline, and the ten slowest imports of
``calctl --help`` from ``python -X importtime`` (cumulative microseconds), so
a regression names the module that caused it, and the same for
``calctl validate --help``. Targets: ``calctl --version`` and ``--help`` under
0.15 s, a sub-command's ``--help`` under 0.3 s, on an idle machine.

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "calctl --version": [sys.executable, "-m", "calctl", "--version"],
    "calctl --help": [sys.executable, "-m", "calctl", "--help"],
    "calctl validate --help": [sys.executable, "-m", "calctl", "validate", "--help"],
    "calctl rules --help": [sys.executable, "-m", "calctl", "rules", "--help"],
    "calctl budget --help": [sys.executable, "-m", "calctl", "budget", "--help"],
    "calctl bringup --help": [sys.executable, "-m", "calctl", "bringup", "--help"],
}


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _slowest_imports(argv: list[str], n: int = 10) -> list[tuple[int, str]]:
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, check=True, timeout=120
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split("|"))
        rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    for argv in COMMANDS.values():  # warm the page cache and .pyc files
        _time(argv)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, argv in COMMANDS.items():
            samples[name].append(_time(argv))
    base = statistics.median(samples["python -c pass"])
    print(f"{'command':<26} {'median s':>9} {'min s':>7} {'- baseline':>11} {'x baseline':>11}")
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"{name:<26} {med:9.3f} {min(xs):7.3f} {med - base:11.3f} {med / base:11.2f}")
    print("\nslowest imports of `calctl --help` (cumulative us):")
    for us, name in _slowest_imports(COMMANDS["calctl --help"]):
        print(f"  {us:>9,}  {name}")
    print("\nslowest imports of `calctl validate --help` (cumulative us):")
    for us, name in _slowest_imports(COMMANDS["calctl validate --help"]):
        print(f"  {us:>9,}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
