"""Measure what the mock's real-model path keeps resident, in budget terms (:mod:`calctl.budget.host`).

:func:`measure` does in this process what the mock board does for one model on one chip: it loads
the model as ``create_calbin``/``configure`` does (:func:`calctl.runtime.mock.compute.load_model`),
then holds ``sequences`` KV caches, each prefilled with ``prompt_tokens`` tokens and advanced by
``decode_steps`` batched decode steps (one ``B = sequences`` job per step). It reads ``VmRSS``
before the load (the runtime overhead), after the jobs (weights + KV + overhead), and ``VmHWM``
over the jobs (plus the workspace), and returns the breakdown with the figures it was checked
against. Run it in a fresh process (``python -m calctl.runners.resident PKG``) so that nothing else
the process did is in the figures.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np

from calctl import records
from calctl.budget.host import HostBreakdown, host_breakdown, proc_status_bytes, reset_peak
from calctl.budget.kv import kv_bytes_per_token
from calctl.budget.shape import shape_from_package_model
from calctl.model import decoder, native
from calctl.package.reader import load_manifest


def _rss() -> int:
    value = proc_status_bytes("VmRSS")
    if value is None:
        raise OSError("/proc/self/status has no VmRSS: the resident set can only be measured on Linux")
    return value


def measure(
    root: Path, alias: str | None = None, *, sequences: int = 4, prompt_tokens: int = 256, decode_steps: int = 4
) -> HostBreakdown:
    """Load ``alias`` (default: the package's first model) and hold ``sequences`` caches; the breakdown."""
    from calctl.runtime.mock import compute

    compute.single_threaded_blas()
    native.kernels()  # built and loaded before the baseline: the kernels are runtime, not model
    pkg = load_manifest(Path(root))
    model = pkg.model(alias) if alias else pkg.models[0]
    arch = model.architecture
    n = min(prompt_tokens, arch.context_limit - decode_steps)
    if n < 1 or sequences < 1:
        raise ValueError(f"prompt_tokens {prompt_tokens} and sequences {sequences} leave nothing to run")
    tokens = (np.arange(n) * 7919 + 13) % arch.vocab_size
    warm = decoder.KvCache.empty(arch, 8)  # numpy's and the decoder's first-call allocations are runtime too
    del warm
    gc.collect()
    base = _rss()
    loaded = compute.load_model(pkg, model)
    gc.collect()
    peak_reset = reset_peak()
    caches = [loaded.empty_cache() for _ in range(sequences)]
    for cache in caches:
        decoder.prefill(loaded.params, arch, tokens, cache)
    for _ in range(decode_steps):
        decoder.decode_batch(
            loaded.params, arch, tokens[: len(caches)] % arch.vocab_size, np.array([c.length for c in caches]), caches
        )
    gc.collect()
    rss = _rss()
    peak = proc_status_bytes("VmHWM") if peak_reset else None
    return host_breakdown(
        weights_bytes=loaded.params.nbytes,
        kv_tokens=sum(c.length for c in caches),
        kv_bytes_per_token=kv_bytes_per_token(shape_from_package_model(model), "fp32"),
        workspace_bytes=max(model.workspace.prefill_peak_bytes, model.workspace.decode_peak_bytes),
        runtime_bytes=base,
        measured_rss=rss,
        measured_peak=peak,
    )


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m calctl.runners.resident", description=__doc__.splitlines()[0])
    ap.add_argument("package", type=Path)
    ap.add_argument("--alias")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=4)
    a = ap.parse_args(argv)
    b = measure(a.package, a.alias, sequences=a.sequences, prompt_tokens=a.prompt_tokens, decode_steps=a.decode_steps)
    print(records.dumps(dict(b.document()), versioned=False, indent=1))
    return 0 if b.rss_ok and b.peak_ok is not False else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
