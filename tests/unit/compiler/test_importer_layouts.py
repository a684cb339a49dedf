"""Import right or refuse (issue 32): both transformers layouts, RoPE from the checkpoint or a refusal by name.

transformers 5's ``save_pretrained`` nests ``rope_theta`` under ``rope_parameters`` and moves the chat
template to ``chat_template.jinja``; calctl used to take ``rope_theta`` 10000 silently and drop the
template (a model that runs and talks nonsense).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calctl.compiler.importer.build import ImportOptions, import_checkpoint, read_gguf_file, read_hf
from calctl.compiler.importer.families import CheckpointError
from calctl.model.tokenizer import CHAT_TEMPLATE
from calctl.package.reader import load_manifest
from calctl.signing.keys import load_private
from tests.conftest import TEST_KEY
from tests.unit.compiler.checkpoint_factory import as_transformers5, hf_forward, tiny_config, write_gguf, write_hf_dir


def _model_bytes(pkg: Path, alias: str) -> dict[str, bytes]:
    """Every file of the model (parameters, golden, programs) and its tokenizer, by path in the package."""
    files = [*(pkg / alias).rglob("*"), *(pkg / "tokenizer").rglob("*")]
    return {str(p.relative_to(pkg)): p.read_bytes() for p in sorted(files) if p.is_file()}


def _arch(pkg: Path) -> dict[str, object]:
    return dict(load_manifest(pkg).document["models"][0]["architecture"])


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_transformers5_directory_imports_byte_identical_to_the_transformers4_one(tmp_path: Path, family: str) -> None:
    v4, cfg, _ = write_hf_dir(tmp_path / "v4", family, seed=3)
    v5, _, _ = write_hf_dir(tmp_path / "v5", family, seed=3)
    v5cfg = as_transformers5(v5, cfg)
    assert "rope_theta" not in v5cfg and not (v5 / "tokenizer_config.json").read_text().count("chat_template")
    key = load_private(TEST_KEY)
    import_checkpoint(tmp_path / "p4", read_hf(v4), ImportOptions(alias="m"), key)
    ck5 = read_hf(v5)
    assert ck5.config == read_hf(v4).config  # rope_theta, eos and bos read from their v5 places
    assert ck5.tokenizer_config["chat_template"] == CHAT_TEMPLATE
    import_checkpoint(tmp_path / "p5", ck5, ImportOptions(alias="m"), key)
    a, b = _model_bytes(tmp_path / "p4", "m"), _model_bytes(tmp_path / "p5", "m")
    assert _arch(tmp_path / "p4") == _arch(tmp_path / "p5")
    (tok4_name,) = [k for k in a if k.endswith("tokenizer_config.json")]
    tok4, tok5 = a.pop(tok4_name), b.pop(tok4_name)
    assert json.loads(tok5)["chat_template"] == json.loads(tok4)["chat_template"] == CHAT_TEMPLATE
    assert a == b  # weights, golden (the chat-templated prompt), tokenizer.json: the same bytes


def test_the_transformers5_import_matches_the_gguf_import_of_the_same_weights(tmp_path: Path) -> None:
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama", seed=4)
    gguf_path = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights, qtype="F32")
    as_transformers5(hf_dir, cfg)
    key = load_private(TEST_KEY)
    import_checkpoint(tmp_path / "pg", read_gguf_file(gguf_path), ImportOptions(alias="m"), key)
    import_checkpoint(tmp_path / "ph", read_hf(hf_dir), ImportOptions(alias="m"), key)
    arch_g, arch_h = _arch(tmp_path / "pg"), _arch(tmp_path / "ph")
    assert arch_g.pop("norm_eps") == pytest.approx(arch_h.pop("norm_eps"), rel=1e-7)  # GGUF holds it as float32
    assert arch_g == arch_h
    g, h = _model_bytes(tmp_path / "pg", "m"), _model_bytes(tmp_path / "ph", "m")
    params = [k for k in g if k.startswith("m/params/")]
    assert params and all(g[k] == h[k] for k in params)


def test_a_config_without_rope_theta_is_refused_naming_it(tmp_path: Path) -> None:
    hf_dir, cfg, _ = write_hf_dir(tmp_path / "hf", "llama")
    (hf_dir / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "rope_theta"}))
    with pytest.raises(CheckpointError, match=r"config\.json: rope_theta: missing"):
        read_hf(hf_dir)
    # transformers 5's block without a base is the same refusal.
    doc = {**{k: v for k, v in cfg.items() if k != "rope_theta"}, "rope_parameters": {"rope_type": "default"}}
    (hf_dir / "config.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"rope_theta: missing"):
        read_hf(hf_dir)


@pytest.mark.parametrize("key", ["rms_norm_eps", "max_position_embeddings"])
def test_other_architecture_numbers_are_not_guessed(tmp_path: Path, key: str) -> None:
    hf_dir, cfg, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    (hf_dir / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != key}))
    with pytest.raises(CheckpointError, match=rf"{key}: missing"):
        read_hf(hf_dir)


@pytest.mark.parametrize("key", ["rope.freq_base", "attention.layer_norm_rms_epsilon", "context_length"])
def test_a_gguf_without_an_architecture_number_is_refused_naming_the_key(tmp_path: Path, key: str) -> None:
    import gguf

    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama")
    src = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights, qtype="F32")
    reader = gguf.GGUFReader(str(src))
    out = tmp_path / "cut.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if field.name == f"llama.{key}" or field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(x) for x in t.shape])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=rf"cut\.gguf: llama\.{key}: missing"):
        read_gguf_file(out)


def test_linear_rope_scaling_matches_transformers_in_both_layouts(tmp_path: Path) -> None:
    scaling = {"rope_type": "linear", "factor": 4.0}
    cfg = {**tiny_config("llama"), "rope_scaling": scaling}
    v4, cfg, weights = write_hf_dir(tmp_path / "v4", "llama", seed=9, config=cfg)
    v5, _, _ = write_hf_dir(tmp_path / "v5", "llama", seed=9, config=cfg)
    v5cfg = as_transformers5(v5, cfg)
    assert v5cfg["rope_parameters"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    prompt = [(5 * i + 1) % 384 for i in range(24)]
    want = hf_forward(weights, cfg, prompt)
    plain = hf_forward(weights, {**cfg, "rope_scaling": None}, prompt)
    assert np.max(np.abs(plain - want)) > 1e-3  # the scaling changes the model
    from tests.unit.compiler.test_importer import _package_logits

    for name, d in (("v4", v4), ("v5", v5)):
        ck = read_hf(d)
        assert ck.config.rope_factors == (4.0,) * 8
        out = tmp_path / f"pkg-{name}"
        import_checkpoint(out, ck, ImportOptions(alias="lin", dtype="fp32"), load_private(TEST_KEY))
        cached, reference = _package_logits(out, prompt)
        np.testing.assert_allclose(reference[-1], want[-1], atol=1e-4, err_msg=f"{name} reference")
        np.testing.assert_allclose(cached, want[-1], atol=1e-4, err_msg=f"{name} mock path")


def test_the_eos_id_only_in_generation_config_is_used(tmp_path: Path) -> None:
    hf_dir, cfg, _ = write_hf_dir(tmp_path / "hf", "qwen3")
    (hf_dir / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "eos_token_id"}))
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    tok_cfg.pop("eos_token")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1], "do_sample": False}))
    out = tmp_path / "pkg"
    summary = import_checkpoint(out, read_hf(hf_dir), ImportOptions(alias="q"), load_private(TEST_KEY))
    assert _arch(out)["eos_token_id"] == 2
    assert not [n for n in summary["notes"] if "never stops" in n], summary["notes"]
    assert "file:generation_config.json" in (out / "build-provenance.json").read_text()  # a recorded input


def test_a_tensor_the_config_does_not_account_for_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    hf_dir, _, weights = write_hf_dir(tmp_path / "hf", "llama")  # attention_bias absent: false
    weights["model.layers.0.self_attn.q_proj.bias"] = np.ones(64, np.float32)
    save_file(weights, str(hf_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.0\.self_attn\.q_proj\.bias is not part of"):
        read_hf(hf_dir)


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        ({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}, r"rope_parameters\.rope_type 'yarn'"),
        ({"rope_type": "longrope", "rope_theta": 1e4}, r"rope_parameters\.rope_type 'longrope'"),
        ({"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}}, "per-layer RoPE"),
        ({"rope_type": "linear", "rope_theta": 1e4}, r"rope_parameters\.factor"),
    ],
)
def test_rope_parameters_the_decoder_cannot_run_are_refused_naming_the_field(
    tmp_path: Path, rope: dict[str, object], match: str
) -> None:
    hf_dir, cfg, _ = write_hf_dir(tmp_path / "hf", "llama")
    doc = {**{k: v for k, v in cfg.items() if k != "rope_theta"}, "rope_parameters": rope}
    (hf_dir / "config.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=match):
        read_hf(hf_dir)
