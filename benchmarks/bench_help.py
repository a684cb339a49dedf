"""Benchmark: the ``--help`` of every calctl command and group, against ``calctl --help``.

Run on demand (not part of the test suite)::

    python benchmarks/bench_help.py [--runs 7] [--only validate,budget]

``calctl --help`` is answered from a table before Typer is imported (about 0.04 s); a command's own help needs
Typer and rich (about 0.2 s) and nothing else: the libraries behind a command (numpy, the validation rules and
jsonschema, cryptography, matplotlib, the serving stack) are imported when the command runs, never for its help
(``tests/unit/cli/test_help_imports.py`` holds that). Target: every command's help under 0.3 s median on an
idle machine.

Each round runs ``calctl --help`` and then every command's help, one child process each, so machine load hits
them alike; the ratio to ``calctl --help`` is taken within each round and its median printed. Last, the five
slowest imports of the slowest help page (``python -X importtime``, cumulative microseconds) name the module
to look at when a page regresses.

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

BASE = [sys.executable, "-m", "calctl"]


def _command_paths() -> list[tuple[str, ...]]:
    """Every command and group, as argument lists (the CLI's own tree, so a new command is timed too)."""
    import typer

    from calctl.cli.app import root_command

    def walk(group, path):
        ctx = typer.Context(group, info_name="calctl")
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            yield (*path, name)
            if hasattr(cmd, "list_commands"):
                yield from walk(cmd, (*path, name))

    return list(walk(root_command(), ()))


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - t0


def _slowest_imports(argv: list[str], n: int = 5) -> list[tuple[int, str]]:
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, check=True, timeout=120
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, _, cumulative, name = (part.strip() for part in line.replace("import time:", "|").split("|"))
        rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="rounds (default 7)")
    ap.add_argument("--only", help="comma-separated commands to time, e.g. validate,'device info'")
    args = ap.parse_args()
    paths = _command_paths()
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        paths = [p for p in paths if " ".join(p) in wanted]
    root = [*BASE, "--help"]
    pages = {" ".join(p): [*BASE, *p, "--help"] for p in paths}
    for argv in [root, *pages.values()]:  # warm the page cache and .pyc files
        _time(argv)
    root_s: list[float] = []
    page_s: dict[str, list[float]] = {name: [] for name in pages}
    ratios: dict[str, list[float]] = {name: [] for name in pages}
    for _ in range(args.runs):
        r = _time(root)
        root_s.append(r)
        for name, argv in pages.items():
            t = _time(argv)
            page_s[name].append(t)
            ratios[name].append(t / r)
    print(f"{'help of':<26} {'median s':>9} {'min s':>7} {'max s':>7} {'x calctl --help':>16}")
    print(f"{'calctl --help':<26} {statistics.median(root_s):9.3f} {min(root_s):7.3f} {max(root_s):7.3f} {1:16.2f}")
    for name, xs in page_s.items():
        print(
            f"{name:<26} {statistics.median(xs):9.3f} {min(xs):7.3f} {max(xs):7.3f} "
            f"{statistics.median(ratios[name]):16.2f}"
        )
    over = [name for name, xs in page_s.items() if statistics.median(xs) > 0.3]
    print(f"\nover 0.3 s median: {', '.join(over) if over else 'none'}")
    if pages:
        slowest = max(page_s, key=lambda name: statistics.median(page_s[name]))
        print(f"\nslowest imports of `calctl {slowest} --help` (cumulative us):")
        for us, module in _slowest_imports(pages[slowest]):
            print(f"  {us:>9,}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
