"""calctl import: tiny random checkpoints in both formats against a direct numpy forward of the originals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calctl.compiler.importer.build import ImportOptions, import_checkpoint, read_gguf_file, read_hf
from calctl.compiler.importer.families import CheckpointError
from calctl.compiler.importer.gguf_file import permute_rope_rows, unpermute_rope_rows
from calctl.model import decoder
from calctl.package.architecture import expected_tensor_shapes
from calctl.package.reader import load_manifest
from calctl.signing.keys import load_private
from tests.conftest import TEST_KEY, TEST_PUB, Cli
from tests.unit.compiler.checkpoint_factory import (
    LLAMA3_SCALING,
    dequantized,
    hf_forward,
    tiny_config,
    write_gguf,
    write_hf_dir,
)

PROMPT = [5, 17, 42, 101, 7, 250, 33, 64, 12, 300]


def _key():
    return load_private(TEST_KEY)


def _package_logits(pkg_root: Path, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(mock cached-path logits of the last token, float64 reference logits of every token) from the package."""
    pkg = load_manifest(pkg_root)
    m = pkg.models[0]
    params = decoder.load_params(pkg.root, m.params)
    cache = decoder.KvCache.empty(m.architecture, 64)
    cached = decoder.prefill(decoder.prepare(params, m.architecture), m.architecture, np.array(tokens), cache)
    return cached, decoder.reference_logits(params, m.architecture, np.array(tokens))


@pytest.mark.parametrize(("family", "tie"), [("llama", False), ("llama", True), ("qwen2", True), ("qwen3", False)])
def test_hf_and_gguf_imports_match_a_direct_forward_of_the_original(tmp_path: Path, family: str, tie: bool) -> None:
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", family, seed=3, tie=tie)
    want = hf_forward(weights, cfg, PROMPT)
    gguf_path = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights)  # Llama Q/K rows permuted like llama.cpp
    for name, ck in (("hf", read_hf(hf_dir)), ("gguf", read_gguf_file(gguf_path))):
        out = tmp_path / f"pkg-{name}"
        import_checkpoint(out, ck, ImportOptions(alias=f"{family}-{name}", dtype="fp32"), _key())
        cached, reference = _package_logits(out, PROMPT)
        np.testing.assert_allclose(reference, want, rtol=1e-9, atol=1e-9, err_msg=f"{name} reference")
        np.testing.assert_allclose(cached, want[-1], rtol=1e-4, atol=1e-4, err_msg=f"{name} mock path")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_llama3_rope_scaling_in_both_formats_matches_transformers(tmp_path: Path, dtype: str) -> None:
    cfg = {**tiny_config("llama"), "rope_scaling": LLAMA3_SCALING}
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama", seed=11, config=cfg)
    long_prompt = [(7 * i + 3) % 384 for i in range(48)]  # long enough for the low-frequency pairs to matter
    want = hf_forward(weights, cfg, long_prompt)
    plain = hf_forward(weights, {**cfg, "rope_scaling": None}, long_prompt)
    assert np.max(np.abs(plain - want)) > 1e-3  # the scaling changes the model: the check below means something
    for name, ck in (
        ("hf", read_hf(hf_dir)),
        ("gguf", read_gguf_file(write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights))),
    ):
        out = tmp_path / f"pkg-{name}-{dtype}"
        import_checkpoint(out, ck, ImportOptions(alias=f"l3-{name}", dtype=dtype), _key())
        m = load_manifest(out).models[0]
        assert m.architecture.rope_freq_factors
        assert {t.dtype for t in m.params if t.name == "rope_freq_factors"} == {"fp32"}
        cached, reference = _package_logits(out, long_prompt)
        tol = 1e-4 if dtype == "fp32" else 5e-2
        np.testing.assert_allclose(reference[-1], want[-1], atol=tol, err_msg=f"{name} reference")
        np.testing.assert_allclose(cached, want[-1], atol=tol, err_msg=f"{name} mock path")


def test_the_manifest_states_the_family_differences(tmp_path: Path) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "qwen3")
    import_checkpoint(tmp_path / "pkg", read_hf(hf_dir), ImportOptions(alias="q3"), _key())
    doc = load_manifest(tmp_path / "pkg").document["models"][0]["architecture"]
    assert doc["family"] == "qwen3" and doc["qk_norm"] is True and doc["attn_bias"] is False
    assert doc["head_dim"] == 24 and doc["d_model"] == 64 and doc["n_heads"] == 4  # explicit, not d_model / heads
    assert doc["rope_style"] == "half" and doc["tie_embeddings"] is False
    assert doc["rope_theta"] == 1000000.0 and doc["norm_eps"] == 1e-6 and doc["max_position_embeddings"] == 512


def test_without_undoing_the_permutation_gguf_llama_would_be_wrong(tmp_path: Path) -> None:
    """The permutation matters: applying it is not a no-op, and unpermute inverts it exactly."""
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(8 * 3, 5)
    assert not np.array_equal(permute_rope_rows(w, 3), w)
    np.testing.assert_array_equal(unpermute_rope_rows(permute_rope_rows(w, 3), 3), w)
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama", seed=1)
    ck = read_gguf_file(write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights))
    np.testing.assert_array_equal(ck.params["layers.0.wq"], weights["model.layers.0.self_attn.q_proj.weight"].T)
    np.testing.assert_array_equal(ck.params["layers.1.wk"], weights["model.layers.1.self_attn.k_proj.weight"].T)


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_quantised_gguf_matches_the_dequantised_original(tmp_path: Path, qtype: str) -> None:
    cfg = tiny_config("llama")
    cfg["hidden_size"], cfg["intermediate_size"] = 64, 128  # rows of whole 32-element quant blocks
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama", seed=2, config=cfg)
    ck = read_gguf_file(write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights, qtype=qtype))
    import_checkpoint(tmp_path / "pkg", ck, ImportOptions(alias="q", dtype="fp32"), _key())
    cached, _ = _package_logits(tmp_path / "pkg", PROMPT)
    np.testing.assert_allclose(cached, hf_forward(dequantized(weights, qtype), cfg, PROMPT)[-1], rtol=1e-4, atol=1e-4)


def test_fp16_storage_stays_close_and_golden_is_from_the_stored_weights(tmp_path: Path) -> None:
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "qwen2", seed=4)
    import_checkpoint(tmp_path / "pkg", read_hf(hf_dir), ImportOptions(alias="q2"), _key())
    pkg = load_manifest(tmp_path / "pkg")
    m = pkg.models[0]
    assert {t.dtype for t in m.params} == {"fp16"} and m.architecture.dtype == "fp16"
    cached, _ = _package_logits(tmp_path / "pkg", PROMPT)
    np.testing.assert_allclose(cached, hf_forward(weights, cfg, PROMPT)[-1], atol=5e-2)
    params = decoder.load_params(pkg.root, m.params)
    prompt = np.load(pkg.root / m.golden.prompt.file)[0]
    want = decoder.reference_logits(params, m.architecture, prompt, last_only=True)
    np.testing.assert_array_equal(np.load(pkg.root / m.golden.prefill_logits.file), want.astype(np.float32))


def test_gguf_tokenizer_is_rebuilt_equal_to_the_original(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama")
    ck = read_gguf_file(write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights))
    rebuilt = Tokenizer.from_str(ck.tokenizer_json.decode())
    original = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    for text in ("Hello, how are you today?", "Numbers 0 16 4096 <|im_start|>user\nhi<|im_end|>", "héllo wörld 🙂"):
        assert rebuilt.encode(text).ids == original.encode(text).ids, text
        assert rebuilt.decode(rebuilt.encode(text).ids, skip_special_tokens=False) == text
    assert ck.tokenizer_config["eos_token"] == "<|im_end|>" and "<|im_start|>" in ck.tokenizer_config["chat_template"]


def test_layout_table_matches_the_param_order(tmp_path: Path) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    import_checkpoint(tmp_path / "pkg", read_hf(hf_dir), ImportOptions(alias="q2"), _key())
    m = load_manifest(tmp_path / "pkg").models[0]
    assert [(t.name, t.shape) for t in m.params] == list(expected_tensor_shapes(m.architecture).items())
    assert "layers.0.bq" in {t.name for t in m.params} and "lm_head" in {t.name for t in m.params}


def test_kv_plan_equals_budget_hf_config(tmp_path: Path, cli: Cli) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "qwen3")
    out = tmp_path / "pkg"
    r = cli("import", "hf", hf_dir, out, "--key", TEST_KEY, "--context", "496", "--sequences", "3")
    assert r.code == 0, r.err
    pkg = cli("budget", out, "--trusted-key", TEST_PUB, "--format", "json")
    cfg = cli(
        "budget", "--hf-config", hf_dir / "config.json", "--context", "496", "--batch", "3",
        "--kv-dtype", "fp32", "--block-tokens", "16", "--format", "json",
    )  # fmt: skip
    assert pkg.code == 0 and cfg.code == 0, (pkg.err, cfg.err)
    assert pkg.json["kv_bytes"] == cfg.json["kv_bytes"] == 2 * 2 * 2 * 24 * 496 * 3 * 4
    assert load_manifest(out).models[0].kv.bytes == pkg.json["kv_bytes"]


# -- refusals --------------------------------------------------------------------------------


def test_unsupported_family_is_refused_by_name(tmp_path: Path) -> None:
    cfg = tiny_config("llama")
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama", config=cfg)
    (hf_dir / "config.json").write_text(json.dumps({**cfg, "model_type": "gemma2"}))
    with pytest.raises(CheckpointError) as exc:
        read_hf(hf_dir)
    assert "config.json" in str(exc.value) and "model_type 'gemma2'" in str(exc.value)
    assert exc.value.hint is not None and "qwen3" in exc.value.hint


def test_gguf_of_an_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(path), "gemma")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"x\.gguf: general\.architecture 'gemma' is not a supported family"):
        read_gguf_file(path)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (
            "rope_scaling",
            {"rope_type": "yarn", "factor": 4.0},
            "rope_scaling.rope_type 'yarn': this RoPE scaling is not",
        ),
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_scaling.type 'dynamic': this RoPE scaling is not"),
        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4}, "rope_parameters.rope_type 'yarn'"),
        (
            "rope_parameters",
            {"rope_type": "default", "rope_theta": 5e5},
            "rope_theta 10000.0 and rope_parameters.rope_theta 500000.0 disagree",
        ),
        ("rope_scaling", {"rope_type": "llama3"}, "rope_scaling.factor: missing"),
        ("rope_scaling", {"rope_type": "linear", "factor": -2.0}, "rope_scaling.factor: -2.0 is outside 1..1024"),
        ("hidden_act", "gelu", "hidden_act 'gelu'"),
        ("num_key_value_heads", 3, "not a multiple"),
        ("hidden_size", "64", "hidden_size: expected an integer"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps: nan is outside 1e-12..0.1"),
    ],
)
def test_config_values_the_decoder_cannot_run_are_refused(tmp_path: Path, key: str, value: object, match: str) -> None:
    hf_dir, cfg, _ = write_hf_dir(tmp_path / "hf", "llama")
    (hf_dir / "config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(CheckpointError, match=match):
        read_hf(hf_dir)


def test_wrong_tensor_shape_names_file_tensor_and_expected(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    hf_dir, _, weights = write_hf_dir(tmp_path / "hf", "qwen2")
    weights["model.layers.1.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)
    save_file(weights, str(hf_dir / "model.safetensors"))
    with pytest.raises(CheckpointError) as exc:
        read_hf(hf_dir)
    msg = str(exc.value)
    assert "model.safetensors" in msg and "model.layers.1.mlp.up_proj.weight" in msg
    assert "[95, 64]" in msg and "[96, 64]" in msg


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    hf_dir, _, weights = write_hf_dir(tmp_path / "hf", "qwen3")
    del weights["model.layers.0.self_attn.k_norm.weight"]
    save_file(weights, str(hf_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no tensor model\.layers\.0\.self_attn\.k_norm\.weight"):
        read_hf(hf_dir)


@pytest.mark.parametrize("cut", [4, 100, -1000, -1])
def test_truncated_safetensors_is_refused(tmp_path: Path, cut: int) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    f = hf_dir / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: (truncated|not a safetensors)"):
        read_hf(hf_dir)


@pytest.mark.parametrize("cut", [3, 64, 2000, -4096, -1])
def test_truncated_gguf_is_refused(tmp_path: Path, cut: int) -> None:
    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama")
    path = write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights)
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(CheckpointError, match=r"m\.gguf: (truncated|not a GGUF)"):
        read_gguf_file(path)


def test_missing_tokenizer_is_refused(tmp_path: Path) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    (hf_dir / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: missing"):
        read_hf(hf_dir)


def test_gguf_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    import gguf

    hf_dir, cfg, weights = write_hf_dir(tmp_path / "hf", "llama")
    src = gguf.GGUFReader(str(write_gguf(tmp_path / "m.gguf", hf_dir, cfg, weights)))
    path = tmp_path / "notok.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for name, field in src.fields.items():
        if name.startswith(("GGUF.", "general.architecture", "tokenizer.")):
            continue
        w.add_key_value(name, field.contents(), gguf.GGUFValueType(field.types[0]))
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"notok\.gguf: no tokenizer\.ggml\.model"):
        read_gguf_file(path)


def test_bf16_safetensors_are_widened_exactly(tmp_path: Path) -> None:
    """numpy has no bfloat16: the importer reads the raw 16 bits the header declares and widens them exactly."""
    import struct

    hf_dir, _, weights = write_hf_dir(tmp_path / "hf", "llama", seed=9)
    header: dict[str, object] = {}
    blobs, offset = [], 0
    for name, arr in weights.items():
        bits = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # truncate to bf16
        data = bits.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    (hf_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    ck = read_hf(hf_dir)
    want = weights["model.layers.1.mlp.down_proj.weight"].view(np.uint32) & np.uint32(0xFFFF0000)
    np.testing.assert_array_equal(ck.params["layers.1.w_down"].T.view(np.uint32), want)
    import_checkpoint(tmp_path / "pkg", ck, ImportOptions(alias="bf"), _key())
    assert load_manifest(tmp_path / "pkg").models[0].architecture.family == "llama"


def test_hf_tokenizer_files_are_kept_byte_for_byte(tmp_path: Path) -> None:
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    import_checkpoint(tmp_path / "pkg", read_hf(hf_dir), ImportOptions(alias="q2"), _key())
    m = load_manifest(tmp_path / "pkg").models[0]
    assert m.tokenizer.config is not None
    for rel, name in ((m.tokenizer.file, "tokenizer.json"), (m.tokenizer.config, "tokenizer_config.json")):
        assert (tmp_path / "pkg" / rel).read_bytes() == (hf_dir / name).read_bytes()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_naming_it(tmp_path: Path) -> None:
    from calctl.model import tokenizer as toklib

    cfg = tiny_config("llama", vocab=512)
    hf_dir, _, _ = write_hf_dir(tmp_path / "hf", "llama", config=cfg)
    (hf_dir / "config.json").write_text(json.dumps({**cfg, "vocab_size": 384}))
    from safetensors.numpy import save_file

    from tests.unit.compiler.checkpoint_factory import random_hf_weights

    save_file(random_hf_weights({**cfg, "vocab_size": 384}), str(hf_dir / "model.safetensors"))
    assert toklib.train(512).get_vocab_size() == 512
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: .*512 entries, more than .*384"):
        import_checkpoint(tmp_path / "pkg", read_hf(hf_dir), ImportOptions(alias="x"), _key())
    assert not (tmp_path / "pkg").exists()
