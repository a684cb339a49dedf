"""Issue 54, a hostile tester's findings against ``import hf`` and ``validate``: RoPE figures, weight shards, the
tokenizer config's tokens and ids. Each input is refused (exit 2 naming file, field and value), and what ``import``
writes is what ``validate`` accepts.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.conftest import TEST_KEY, TEST_PUB, Cli
from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING, as_transformers5, tiny_config, write_hf_dir
from tests.unit.validate.validate_factory import edit_manifest, reseal, validate_json


def _import(cli: Cli, src: Path, out: Path) -> Any:
    r = cli("import", "hf", src, out, "--key", TEST_KEY)
    assert "Traceback" not in r.err and "internal error" not in r.err, r.err
    return r


def _refused(cli: Cli, tmp_path: Path, src: Path, *says: str) -> None:
    out = tmp_path / "pkg"
    r = _import(cli, src, out)
    text = " ".join(r.err.split())
    assert r.code == 2, text
    for s in says:
        assert s in text, text
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- 4. RoPE figures


def _llama(tmp_path: Path, **edits: Any) -> tuple[Path, dict[str, Any]]:
    cfg = tiny_config("llama")
    cfg.update(edits)
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama", config=cfg)
    return d, cfg


def _scaled(**scaling: Any) -> dict[str, Any]:
    return {**LLAMA3_SCALING, **scaling}


ROPE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("llama3-factor-1e308", {"rope_scaling": _scaled(factor=1e308)}, "rope_scaling.factor: 1e+308 is outside 1..1024"),
    ("llama3-factor-nan", {"rope_scaling": _scaled(factor=float("nan"))}, "rope_scaling.factor: nan is outside"),
    (
        "linear-factor-inf",
        {"rope_scaling": {"rope_type": "linear", "factor": float("inf")}},
        "rope_scaling.factor: inf is outside",
    ),
    ("linear-factor-below-1", {"rope_scaling": {"type": "linear", "factor": 0.25}}, "rope_scaling.factor: 0.25"),
    ("linear-factor-missing", {"rope_scaling": {"type": "linear"}}, "rope_scaling.factor: missing"),
    ("factor-a-bool", {"rope_scaling": _scaled(factor=True)}, "rope_scaling.factor: expected a number, found True"),
    ("factor-a-string", {"rope_scaling": _scaled(factor="8")}, "rope_scaling.factor: expected a number, found '8'"),
    ("low-minus-zero", {"rope_scaling": _scaled(low_freq_factor=-0.0)}, "rope_scaling.low_freq_factor: -0.0"),
    ("high-1e300", {"rope_scaling": _scaled(high_freq_factor=1e300)}, "rope_scaling.high_freq_factor: 1e+300"),
    ("high-below-low", {"rope_scaling": _scaled(low_freq_factor=4.0, high_freq_factor=1.0)}, "must exceed"),
    (
        "original-context-huge",
        {"rope_scaling": _scaled(original_max_position_embeddings=10**9)},
        "original_max_position_embeddings: 1000000000 is over the limit",
    ),
    (
        "original-context-over-max",
        {"rope_scaling": _scaled(original_max_position_embeddings=4096)},
        "original_max_position_embeddings 4096 is over max_position_embeddings 512",
    ),
    ("theta-1e308", {"rope_theta": 1e308}, "rope_theta: 1e+308 is outside 1..1e+10"),
    ("theta-a-string", {"rope_theta": "10000"}, "rope_theta: expected a number, found '10000'"),
    ("partial-rotary", {"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5: expected 1.0"),
]


@pytest.mark.parametrize(("edits", "says"), [c[1:] for c in ROPE_CASES], ids=[c[0] for c in ROPE_CASES])
def test_a_rope_figure_out_of_range_is_refused_naming_field_value_and_range(
    cli: Cli, tmp_path: Path, edits: dict[str, Any], says: str
) -> None:
    d, _ = _llama(tmp_path, **edits)
    _refused(cli, tmp_path, d, "config.json:", says)


def test_validate_refuses_rope_divisors_stored_as_integers(cli: Cli, tmp_path: Path) -> None:
    d, _ = _llama(tmp_path, rope_scaling=_scaled())
    pkg = tmp_path / "pkg"
    assert _import(cli, d, pkg).code == 0

    def as_int(doc: dict[str, Any]) -> None:
        t = next(t for t in doc["models"][0]["params"]["tensors"] if t["name"] == "rope_freq_factors")
        t["dtype"] = "int32"

    edit_manifest(pkg, as_int)
    reseal(pkg)
    code, doc = validate_json(cli, pkg)
    (gold,) = [c for c in doc["checks"] if c["id"] == "GOLD009"]
    assert code == 1 and gold["status"] == "fail" and "is not a float tensor" in gold["message"], gold


def test_a_transformers5_rope_parameters_factor_of_1e308_is_refused(cli: Cli, tmp_path: Path) -> None:
    d, cfg = _llama(tmp_path, rope_scaling=_scaled(factor=1e308))
    as_transformers5(d, cfg)
    _refused(cli, tmp_path, d, "rope_parameters.factor: 1e+308 is outside 1..1024", "calctl.limits.ROPE_FACTOR")


def _set_rope_factors(root: Path, values: np.ndarray) -> None:
    doc = yaml.safe_load((root / "manifest.yaml").read_text())
    t = next(t for t in doc["models"][0]["params"]["tensors"] if t["name"] == "rope_freq_factors")
    blob = root / t["file"]
    raw = bytearray(blob.read_bytes())
    raw[t["offset"] : t["offset"] + 4 * len(values)] = values.astype("<f4").tobytes()
    blob.write_bytes(bytes(raw))
    reseal(root)


@pytest.mark.parametrize("bad", [np.inf, np.nan, 0.0, 1e30])
def test_validate_and_run_golden_refuse_a_package_whose_rope_divisors_are_out_of_range(
    cli: Cli, tmp_path: Path, bad: float
) -> None:
    """A package sealed by hand or by an older importer (which wrote infinite divisors for a factor of 1e308)."""
    d, _ = _llama(tmp_path, rope_scaling=_scaled())
    pkg = tmp_path / "pkg"
    assert _import(cli, d, pkg).code == 0
    assert validate_json(cli, pkg)[0] == 0
    values = np.full(8, 2.0)
    values[3] = bad
    _set_rope_factors(pkg, values)
    code, doc = validate_json(cli, pkg)
    (gold,) = [c for c in doc["checks"] if c["id"] == "GOLD009"]
    assert code == 1 and gold["status"] == "fail", gold
    assert f"[3] = {float(np.float32(bad))!r}" in gold["message"] and "calctl.limits.ROPE_FACTOR" in gold["message"]
    r = cli("run-golden", pkg, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "GOLD009" in r.out + r.err
    r = cli("combine", pkg, pkg, tmp_path / "twice", "--key", TEST_KEY, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "does not validate: GOLD009" in " ".join(r.err.split()), r.err
    assert not (tmp_path / "twice").exists()


# ---------------------------------------------------------------------------------------------- 5. weight shards


def _shard(d: Path, weights: dict[str, np.ndarray], names: list[str], file: str) -> None:
    from safetensors.numpy import save_file

    save_file({n: weights[n] for n in names}, str(d / file), metadata={"format": "pt"})


def _sharded(tmp_path: Path, *, index: bool = True) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    """The tiny llama in two shards (and their index, as save_pretrained writes them)."""
    d, _, w = write_hf_dir(tmp_path / "hf", "llama")
    (d / "model.safetensors").unlink()
    names = sorted(w)
    half = len(names) // 2
    files = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, part in files.items():
        _shard(d, w, part, file)
    weight_map = {n: f for f, part in files.items() for n in part}
    if index:
        _write_index(d, weight_map)
    return d, w, weight_map


def _write_index(d: Path, weight_map: dict[str, str]) -> None:
    doc = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(doc, indent=2))


def test_a_sharded_checkpoint_with_its_index_imports_and_validates(cli: Cli, tmp_path: Path) -> None:
    d, w, _ = _sharded(tmp_path)
    _shard(d, w, sorted(w), "consolidated.safetensors")  # Mistral ships one beside the shards: not in the index
    pkg = tmp_path / "pkg"
    r = cli("import", "hf", d, pkg, "--key", TEST_KEY, "-f", "json")
    assert r.code == 0, r.err
    (note,) = [n for n in r.json["notes"] if "consolidated.safetensors" in n]
    assert "not read" in note
    assert validate_json(cli, pkg)[0] == 0


def test_two_shards_defining_one_tensor_are_refused_naming_both_files_and_the_tensor(cli: Cli, tmp_path: Path) -> None:
    d, w, _ = _sharded(tmp_path, index=False)
    _shard(d, {"model.norm.weight": w["model.norm.weight"] * 2}, ["model.norm.weight"], "model-extra.safetensors")
    _refused(
        cli,
        tmp_path,
        d,
        "tensor model.norm.weight is also defined in",
        "model-extra.safetensors",
        "model-00002-of-00002.safetensors",
    )


def test_a_safetensors_header_stating_one_tensor_twice_is_refused(cli: Cli, tmp_path: Path) -> None:
    """The safetensors library opens such a file (the last entry wins); calctl refuses it."""
    import struct

    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    path = d / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n].decode()
    start = header.index('"model.norm.weight":')
    entry = header[start : header.index("}", start) + 1]
    doubled = header.replace("{", "{" + entry + ",", 1).encode()
    doubled += b" " * (-len(doubled) % 8)
    path.write_bytes(struct.pack("<Q", len(doubled)) + doubled + raw[8 + n :])
    _refused(cli, tmp_path, d, "model.safetensors: its header states the key 'model.norm.weight' twice")


def test_more_weight_files_than_the_limit_are_refused_before_any_is_opened(cli: Cli, tmp_path: Path) -> None:
    from calctl import limits

    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    for i in range(limits.MAX_SHARDS.maximum):
        (d / f"x-{i:05d}.safetensors").write_bytes(b"")  # empty: refused by count, not by content
    _refused(cli, tmp_path, d, "4,097 *.safetensors files", "calctl.limits.MAX_SHARDS")


def test_an_index_mapping_one_tensor_twice_is_refused_naming_the_tensor(cli: Cli, tmp_path: Path) -> None:
    d, _, weight_map = _sharded(tmp_path)
    text = json.dumps({"weight_map": weight_map}, indent=1)
    dup = '"model.norm.weight": "model-00001-of-00002.safetensors",\n'
    (d / "model.safetensors.index.json").write_text(text.replace('"weight_map": {', '"weight_map": {' + dup, 1))
    _refused(cli, tmp_path, d, "model.safetensors.index.json: key 'model.norm.weight' appears twice")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (unicodedata.normalize("NFC", "café.safetensors"), unicodedata.normalize("NFD", "café.safetensors")),
        ("Model.safetensors", "model.safetensors"),
    ],
    ids=["nfc-nfd", "case"],
)
def test_twin_shard_names_are_refused_naming_both(cli: Cli, tmp_path: Path, first: str, second: str) -> None:
    d, w, _ = _sharded(tmp_path, index=False)
    for f in d.glob("model-0000*.safetensors"):
        f.unlink()
    names = sorted(w)
    _shard(d, w, names[:5], first)
    _shard(d, w, names[5:], second)
    a, b = sorted((first, second))
    _refused(cli, tmp_path, d, f"weight files {a!a} and {b!a} differ only by letter case or Unicode")


def test_an_index_naming_an_absent_file_is_refused_naming_file_and_tensor(cli: Cli, tmp_path: Path) -> None:
    d, _, weight_map = _sharded(tmp_path)
    _write_index(d, {**weight_map, "model.norm.weight": "model-00003-of-00003.safetensors"})
    _refused(cli, tmp_path, d, "weight_map maps tensor model.norm.weight to 'model-00003-of-00003.safetensors', which")


@pytest.mark.parametrize("name", ["../model-00001-of-00002.safetensors", "/etc/passwd", "model.bin", 7])
def test_an_index_naming_anything_but_a_file_beside_it_is_refused(cli: Cli, tmp_path: Path, name: object) -> None:
    d, _, weight_map = _sharded(tmp_path)
    _write_index(d, {**weight_map, "model.norm.weight": name})  # type: ignore[dict-item]
    _refused(cli, tmp_path, d, "weight_map['model.norm.weight']: expected a *.safetensors file name")


def test_a_shard_holding_a_tensor_the_index_does_not_mention_is_refused(cli: Cli, tmp_path: Path) -> None:
    d, _, weight_map = _sharded(tmp_path)
    _write_index(d, {k: v for k, v in weight_map.items() if k != "model.norm.weight"})
    _refused(cli, tmp_path, d, "holds tensor model.norm.weight, but model.safetensors.index.json does not mention it")


def test_an_index_mapping_a_tensor_to_a_shard_without_it_is_refused(cli: Cli, tmp_path: Path) -> None:
    d, _, weight_map = _sharded(tmp_path)
    other = {"model-00001-of-00002.safetensors": "model-00002-of-00002.safetensors"}
    wrong = {
        k: other.get(v, "model-00001-of-00002.safetensors") if k == "model.norm.weight" else v
        for k, v in weight_map.items()
    }
    _write_index(d, wrong)
    _refused(cli, tmp_path, d, "holds tensor model.norm.weight, but model.safetensors.index.json maps it to")


# ------------------------------------------------------------------- 6, 7. the tokenizer config's tokens and ids


def _tok_cfg(d: Path, **edits: Any) -> None:
    path = d / "tokenizer_config.json"
    doc = json.loads(path.read_text())
    doc.update(edits)
    path.write_text(json.dumps(doc, indent=1))


ADDED = {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "special": True}

TOKEN_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("eos-unknown", {"eos_token": "<|eot|>"}, "eos_token: '<|eot|>' is not a token of the tokenizer"),
    ("bos-unknown", {"bos_token": "<s>"}, "bos_token: '<s>' is not a token of the tokenizer"),
    ("pad-unknown", {"pad_token": "[PAD]"}, "pad_token: '[PAD]' is not a token of the tokenizer"),
    ("unk-unknown", {"unk_token": "<unk>"}, "unk_token: '<unk>' is not a token of the tokenizer"),
    ("eos-added-token-unknown", {"eos_token": {**ADDED, "content": "<|eot|>"}}, "eos_token: '<|eot|>' is not"),
    ("eos-a-number", {"eos_token": 2}, "eos_token: expected a token (a string or an object"),
    ("extra-unknown", {"additional_special_tokens": ["<|im_end|>", "<|x|>"]}, "additional_special_tokens[1]: '<|x|>'"),
    (
        "decoder-id-past-vocab",
        {"added_tokens_decoder": {"1000000": ADDED}},
        "added_tokens_decoder['1000000']: id 1000000 is outside the vocabulary of 384 entries (ids 0..383)",
    ),
    (
        "decoder-id-at-vocab",
        {"added_tokens_decoder": {"384": ADDED}},
        "added_tokens_decoder['384']: id 384 is outside the vocabulary of 384 entries",
    ),
    ("decoder-id-not-a-number", {"added_tokens_decoder": {"-1": ADDED}}, "the key '-1' is not a token id"),
    (
        "decoder-id-elsewhere",
        {"added_tokens_decoder": {"5": ADDED}},
        "token '<|im_end|>' has id 2 in tokenizer.json, not 5",
    ),
]


@pytest.mark.parametrize(("edits", "says"), [c[1:] for c in TOKEN_CASES], ids=[c[0] for c in TOKEN_CASES])
def test_a_tokenizer_config_token_or_id_the_tokenizer_lacks_is_refused_at_import(
    cli: Cli, tmp_path: Path, edits: dict[str, Any], says: str
) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    _tok_cfg(d, **edits)
    _refused(cli, tmp_path, d, "tokenizer_config.json:", says)


GEN_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("eos-list-past-vocab", {"eos_token_id": [2, 99999]}, "eos_token_id[1] 99999 is outside the vocabulary"),
    ("eos-list-a-bool", {"eos_token_id": [2, True]}, "eos_token_id[1]: expected a token id"),
    ("eos-list-a-string", {"eos_token_id": ["2"]}, "eos_token_id[0]: expected a token id"),
    ("pad-past-vocab", {"pad_token_id": 384}, "pad_token_id 384 is outside the vocabulary"),
]


@pytest.mark.parametrize(("gen", "says"), [c[1:] for c in GEN_CASES], ids=[c[0] for c in GEN_CASES])
def test_a_generation_config_id_past_the_vocabulary_is_refused_naming_file_and_index(
    cli: Cli, tmp_path: Path, gen: dict[str, Any], says: str
) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    (d / "generation_config.json").write_text(json.dumps(gen))
    _refused(cli, tmp_path, d, "generation_config.json:", says)


ACCEPTED: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("eos-added-token-object", {"eos_token": {**ADDED}}, None),
    ("decoder-matching", {"added_tokens_decoder": {"2": ADDED}, "additional_special_tokens": ["<|im_start|>"]}, None),
    ("pad-null-unk-null", {"pad_token": None, "unk_token": None}, None),
    ("generation-eos-list", {}, {"eos_token_id": [2, 0], "pad_token_id": 0}),
]


@pytest.mark.parametrize(("edits", "gen"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_what_import_writes_from_a_valid_tokenizer_config_validates(
    cli: Cli, tmp_path: Path, edits: dict[str, Any], gen: dict[str, Any] | None
) -> None:
    """import never writes a package that validate refuses: the accepted neighbours of the refused cases above."""
    d, _, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    _tok_cfg(d, **edits)
    if gen is not None:
        (d / "generation_config.json").write_text(json.dumps(gen))
    pkg = tmp_path / "pkg"
    assert _import(cli, d, pkg).code == 0
    code, doc = validate_json(cli, pkg)
    assert code == 0, [c for c in doc["checks"] if c["status"] in ("fail", "error")]


@pytest.mark.parametrize(("edits", "says"), [c[1:] for c in TOKEN_CASES], ids=[c[0] for c in TOKEN_CASES])
def test_validate_refuses_the_same_tokenizer_configs_in_a_package(
    cli: Cli, tmp_path: Path, edits: dict[str, Any], says: str
) -> None:
    """A package sealed by hand or by an older importer: TOK002 (ids by value) or TOK004 (special tokens)."""
    d, _, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    pkg = tmp_path / "pkg"
    assert _import(cli, d, pkg).code == 0
    (cfg_path,) = pkg.glob("tokenizer/*/tokenizer_config.json")
    _tok_cfg(cfg_path.parent, **edits)
    reseal(pkg)
    code, doc = validate_json(cli, pkg)
    failing = [c for c in doc["checks"] if c["status"] == "fail"]
    assert code == 1 and {c["id"] for c in failing} <= {"TOK002", "TOK004"}, failing
    assert any(says in c["message"] for c in failing), failing


@pytest.mark.parametrize("base", [1e30, 0.5])
def test_a_gguf_rope_freq_base_out_of_range_is_refused_by_the_same_table(cli: Cli, tmp_path: Path, base: float) -> None:
    from tests.integration.test_declared_numbers_hostile import _f32, gguf_bytes, llama_metadata

    default = _f32("llama.rope.freq_base", 10000.0)
    path = tmp_path / "base.gguf"
    path.write_bytes(gguf_bytes([_f32("llama.rope.freq_base", base) if b == default else b for b in llama_metadata()]))
    r = cli("import", "gguf", path, tmp_path / "pkg", "--key", TEST_KEY)
    text = " ".join(r.err.split())
    assert r.code == 2 and "llama.rope.freq_base:" in text and "calctl.limits.ROPE_THETA" in text, text
