"""Issue 32 item 2: the real-model path's resident memory in budget terms (weights, KV, workspace, runtime),
checked against the process's measured VmRSS within calctl.budget.host's stated tolerance.

Sizes only, never timings. The measurement runs in a fresh process (``python -m calctl.runners.resident``),
so what the test process did before is not in it. The same check on the real SmolLM2 is in
tests/integration/test_smollm2.py (it shares that file's one import of the model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calctl.budget.host import (
    KV,
    RUNTIME_OVERHEAD,
    TOLERANCE_BYTES,
    TOLERANCE_SHARE,
    W_COMPILED,
    WORKSPACE,
    host_breakdown,
    proc_status_bytes,
)
from tests.conftest import TEST_KEY
from tests.unit.compiler.checkpoint_factory import tiny_config, write_hf_dir

MIB = 1024 * 1024
LINUX = proc_status_bytes("VmRSS") is not None


def _breakdown(rss: int, peak: int | None = None):
    return host_breakdown(
        weights_bytes=100 * MIB,
        kv_tokens=1000,
        kv_bytes_per_token=46080,
        workspace_bytes=200 * MIB,
        runtime_bytes=50 * MIB,
        measured_rss=rss,
        measured_peak=peak,
    )


def test_the_terms_and_the_tolerance() -> None:
    b = _breakdown(150 * MIB + 46_080_000)
    assert [t.name for t in b.terms] == [W_COMPILED, KV, WORKSPACE, RUNTIME_OVERHEAD]
    assert b.term(KV) == 46_080_000 and b.resident == 150 * MIB + 46_080_000  # the workspace is not resident
    assert b.tolerance == TOLERANCE_BYTES + int(TOLERANCE_SHARE * b.resident)
    assert b.unexplained == 0 and b.rss_ok and b.peak_ok is None
    assert _breakdown(b.resident + b.tolerance).rss_ok
    assert not _breakdown(b.resident + b.tolerance + 1).rss_ok  # a leak past the slack
    assert not _breakdown(b.resident - b.tolerance - 1).rss_ok  # a term that claims more than is held
    assert _breakdown(b.resident, peak=b.resident + 200 * MIB + b.tolerance).peak_ok
    assert _breakdown(b.resident, peak=b.resident + 200 * MIB + b.tolerance + 1).peak_ok is False
    doc = b.document()
    assert doc["measured_rss_bytes"] == b.measured_rss and doc["rss_ok"] is True
    assert [t["name"] for t in doc["terms"]] == [W_COMPILED, KV, WORKSPACE, RUNTIME_OVERHEAD]


def _measure(pkg: Path, tmp: Path, *args: str) -> tuple[int, dict]:
    env = {**os.environ, "CALCTL_CACHE_DIR": str(tmp / "cache"), "CALCTL_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "calctl.runners.resident", str(pkg), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def _terms(doc: dict) -> dict[str, int]:
    return {t["name"]: t["bytes"] for t in doc["terms"]}


@pytest.mark.skipif(not LINUX, reason="VmRSS is read from /proc (Linux only)")
def test_a_model_with_8_lanes_holds_its_weights_its_live_kv_and_the_runtime(cli, tmp_path: Path) -> None:
    # 4 layers x 2 KV heads x 64: 4 KiB of fp32 KV per token, a 1 MiB slice per layer and lane at 2048 tokens.
    cfg = {**tiny_config("llama"), "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
    cfg.update({"num_hidden_layers": 4, "intermediate_size": 768, "max_position_embeddings": 2048})
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama", seed=4, config=cfg)
    pkg = tmp_path / "pkg"
    r = cli("import", "hf", hf_dir, pkg, "--key", TEST_KEY, "--alias", "m", "--context", "2048", "--sequences", "8")
    assert r.code == 0, r.err
    rc, doc = _measure(pkg, tmp_path, "--sequences", "8", "--prompt-tokens", "256", "--decode-steps", "4")
    terms = _terms(doc)
    assert terms[KV] == 8 * (256 + 4) * 2 * 4 * 2 * 64 * 4
    capacity = 8 * 2048 * 2 * 4 * 2 * 64 * 4  # 64 MiB: what a cache resident at its capacity would hold
    assert capacity - terms[KV] > doc["tolerance_bytes"]  # so the check below tells the two apart
    assert doc["measured_rss_bytes"] - terms[RUNTIME_OVERHEAD] >= terms[W_COMPILED]  # the weights are resident
    assert abs(doc["unexplained_bytes"]) <= doc["tolerance_bytes"], doc
    assert doc["rss_ok"] is True and rc == 0
    assert doc["peak_ok"] in (True, None), doc
