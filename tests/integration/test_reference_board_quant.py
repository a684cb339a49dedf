"""Issue 32 item 1 on the reference board: a package that keeps a GGUF's Q4_0, Q4_1 or Q8_0 blocks runs there
too. The board dequantises the blocks to float32 at load (calrt_ext.h ``CALRT_EXT_DTYPE_Q*``) and computes on
exactly those weights, so run-golden PASSes against the float64 reference of the stored weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from calctl.package.reader import load_manifest
from tests.conftest import TEST_KEY, TEST_PUB, Cli, assert_no_traceback, assert_passed
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)
from tests.unit.compiler.checkpoint_factory import write_gguf, write_hf_dir

TRUST = ("--trusted-key", str(TEST_PUB))


@pytest.mark.parametrize(("qtype", "family"), [("Q4_0", "llama"), ("Q4_1", "qwen2"), ("Q8_0", "llama")])
def test_a_quantised_package_passes_golden_on_the_reference_board(
    cli: Cli,
    tmp_path: Path,
    reference_board: Path,  # noqa: F811
    qtype: str,
    family: str,
) -> None:
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", family, seed=21)
    gguf_path = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights, qtype=qtype)
    pkg = tmp_path / "pkg"
    r = cli("import", "gguf", gguf_path, pkg, "--key", TEST_KEY, "--alias", "m")
    assert r.code == 0, r.err
    dtypes = {t.dtype for t in load_manifest(pkg).model("m").params}
    assert qtype.lower() in dtypes, dtypes  # the blocks are kept, not dequantised by the importer
    g = cli("run-golden", pkg, *TRUST, "--device", "calrt", "--calrt-lib", str(reference_board), "--format", "json")
    assert_no_traceback(g)
    assert g.code == 0, g.out[-2000:] + g.err[-2000:]
    assert_passed(g.json)
    assert g.json["device"] == "calrt" and g.json["runtime"]["software_model"] is True
