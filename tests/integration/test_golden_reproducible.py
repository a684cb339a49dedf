"""``calctl sample-package`` on two machines: each package passes ``run-golden`` against the other's golden data.

"Another machine" is a subprocess whose float arithmetic really differs from this one's:

* OpenBLAS forced to its baseline kernel (``OPENBLAS_CORETYPE``: no AVX2/AVX-512 GEMM, no FMA) with one
  thread, so the matrix products sum in another order;
* numpy's own SIMD dispatch switched off (``NPY_DISABLE_CPU_FEATURES``), so exp/sqrt take other code paths;
* and, so the difference exists on every CPU and BLAS, every RMSNorm output is nudged by 4 ulps of its dtype.

The test checks that the difference is real (the float32 reference path, how golden data used to be made,
gives other bits there), then that the other machine's package reproduces the committed fixture under the
guarantee in ``tests/unit/package/sample_compare.py``, and that ``run-golden`` passes crosswise: the other
machine's mock device against the committed golden data, this machine's against the other's.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from calctl.model import decoder
from calctl.package.reader import load_manifest
from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_KEY, TEST_PUB, Cli, assert_passed
from tests.unit.package.sample_compare import assert_reproduces

# The RMSNorm functions of the reference and cached paths, wherever the decoder keeps them.
NORMS = (("calctl.model.decoder", "_ref_rms"), ("calctl.model.decoder", "_rms"))
# Runs calctl's CLI with the float path nudged; argv[1] is a file for the float32 reference digest.
OTHER_MACHINE = f"NORMS = {NORMS!r}\n" + textwrap.dedent(
    """
    import hashlib, importlib, sys
    from pathlib import Path
    import numpy as np
    from calctl.model import decoder

    def nudge(norm):
        def nudged(x, w, eps):
            out = norm(x, w, eps)
            return out * (1 + 4 * np.finfo(out.dtype).eps)
        return nudged

    patched = 0
    for module, name in NORMS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, name):
            setattr(mod, name, nudge(getattr(mod, name)))
            patched += 1
    if not patched:
        sys.exit("no RMSNorm function found to nudge: update NORMS in test_golden_reproducible.py")
    from calctl.cli.app import main
    from calctl.package.reader import load_manifest

    digest_file, *argv = sys.argv[1:]
    if digest_file != "-":
        pkg = load_manifest(Path(argv[0]))
        with open(digest_file, "w") as f:
            for m in pkg.models:
                params = decoder.load_params(pkg.root, m.params)
                prompt = np.load(pkg.root / m.golden.prompt.file)[0]
                logits = decoder.reference_logits(params, m.architecture, prompt, dtype=np.float32)[-1]
                f.write(hashlib.sha256(logits.tobytes()).hexdigest())
                f.write("\\n")
        argv = argv[1:]
    sys.exit(main(argv))
    """
)


def _other_machine_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CALCTL_CACHE_DIR": str(tmp_path / "cache")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    baseline_kernel = {"x86_64": "Prescott", "AMD64": "Prescott", "aarch64": "ARMV8", "arm64": "ARMV8"}
    if platform.machine() in baseline_kernel:
        env["OPENBLAS_CORETYPE"] = baseline_kernel[platform.machine()]
    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        umath = importlib.import_module("numpy.core._multiarray_umath")
    dispatched = [f for f in getattr(umath, "__cpu_dispatch__", []) if umath.__cpu_features__.get(f)]
    if dispatched:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(dispatched)
    return env


def _run_other(tmp_path: Path, digest_file: str, *args: object) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", OTHER_MACHINE, digest_file, *map(str, args)]
    return subprocess.run(cmd, env=_other_machine_env(tmp_path), capture_output=True, text=True, timeout=300)


def test_sample_packages_from_two_machines_pass_golden_against_each_other(tmp_path: Path, cli: Cli) -> None:
    committed = FIXTURE_PACKAGES / "combined"
    other = tmp_path / "other-machine"
    digests = tmp_path / "float32-digests.txt"

    # The other machine builds its package (and records its float32 reference bits for the committed prompts).
    proc = _run_other(tmp_path, str(digests), committed, "sample-package", other, "--kind", "combined",
                      "--key", TEST_KEY, "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr

    # The simulated machine really computes other float bits than this one.
    pkg = load_manifest(committed)
    here = []
    for m in pkg.models:
        params = decoder.load_params(pkg.root, m.params)
        prompt = np.load(pkg.root / m.golden.prompt.file)[0]
        logits = decoder.reference_logits(params, m.architecture, prompt, dtype=np.float32)[-1]
        here.append(hashlib.sha256(logits.tobytes()).hexdigest())
    there = digests.read_text().split()
    assert len(there) == len(here) and all(a != b for a, b in zip(here, there, strict=True)), (
        "the simulated machine computed the same float32 bits as this one: the test would show nothing"
    )

    # Its package is the committed one (byte for byte, or golden logits one rounding step away).
    assert_reproduces(other, committed)

    # The other machine's mock device passes the committed golden data ...
    proc = _run_other(tmp_path, "-", "run-golden", committed, "--trusted-key", TEST_PUB, "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and this machine's passes the other machine's.
    r = cli("run-golden", other, "--trusted-key", TEST_PUB, "--format", "json")
    assert r.code == 0, r.out + r.err
    assert_passed(r.json)
    assert all(m["ok"] for m in r.json["models"])
