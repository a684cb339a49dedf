"""Issue 54: every number a checkpoint or config declares is bounded (calctl.limits) before it costs anything,
and every JSON document's nesting is bounded, in ``import hf``, ``import gguf`` and ``budget --hf-config``.

Each case runs calctl in a child with a memory ceiling and a deadline (:mod:`tests.integration.hostile_run`): on the code before
issue 54 they ran out of memory, hung, or ended in exit 70.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from calctl import limits
from tests.conftest import TEST_KEY
from tests.integration.hostile_run import run_bounded
from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING, tiny_config, write_hf_dir

# ---------------------------------------------------------------------------- a GGUF written byte by byte


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def gguf_bytes(kvs: list[bytes], tensors: int = 0, tensor_infos: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kvs)) + b"".join(kvs) + tensor_infos


def _u32(key: str, value: int) -> bytes:
    return _kv(key, 4, struct.pack("<I", value))


def _f32(key: str, value: float) -> bytes:
    return _kv(key, 6, struct.pack("<f", value))


def llama_metadata(**overrides: int) -> list[bytes]:
    """The metadata ``from_gguf_metadata`` needs for a llama, with ``overrides`` (key after ``llama.``)."""
    values = {
        "block_count": 2,
        "context_length": 512,
        "embedding_length": 64,
        "feed_forward_length": 96,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "vocab_size": 384,
        **overrides,
    }
    return [
        _kv("general.architecture", 8, _s("llama")),
        *(_u32(f"llama.{k}", v) for k, v in values.items()),
        _f32("llama.rope.freq_base", 10000.0),
        _f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
    ]


def _import_gguf(tmp_path: Path, data: bytes) -> Any:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    return run_bounded("import", "gguf", path, tmp_path / "out", "--key", TEST_KEY)


@pytest.mark.parametrize(
    ("key", "value", "limit"),
    [
        ("block_count", 2**32 - 1, limits.MAX_LAYERS),
        ("attention.head_count", 2**31, limits.MAX_HEADS),
        ("vocab_size", 4_000_000_000, limits.MAX_VOCAB),
    ],
)
def test_a_few_hundred_byte_gguf_declaring_a_huge_count_is_refused_naming_key_value_and_limit(
    tmp_path: Path, key: str, value: int, limit: limits.Limit
) -> None:
    data = gguf_bytes(llama_metadata(**{key: value}))
    assert len(data) < 500
    r = _import_gguf(tmp_path, data)
    assert r.code == 2, r.text
    assert f"llama.{key}" in r.text and f"{value}" in r.text and f"{limit.maximum:,}" in r.text, r.text
    assert "hostile.gguf" in r.text and "Traceback" not in r.err


@pytest.mark.parametrize("etype", [8, 0, 9], ids=["strings", "bytes", "arrays"])
def test_a_metadata_array_declaring_a_billion_entries_is_refused_before_the_gguf_library_reads_it(
    tmp_path: Path, etype: int
) -> None:
    data = gguf_bytes([_kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", etype, 10**9))])
    assert len(data) < 100
    r = _import_gguf(tmp_path, data)
    assert r.code == 2, r.text
    assert "tokenizer.ggml.tokens" in r.text and "1,000,000,000" in r.text, r.text


def test_a_gguf_declaring_more_keys_or_tensors_than_its_bytes_is_refused(tmp_path: Path) -> None:
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40)
    r = _import_gguf(tmp_path, data)
    assert r.code == 2 and "the metadata declares 1,099,511,627,776 entries" in r.text, r.text
    data = gguf_bytes(llama_metadata(), tensors=10_000)
    r = _import_gguf(tmp_path, data)
    assert r.code == 2 and "the tensor table" in r.text and "needs 240,000 bytes" in r.text, r.text


def test_a_tensor_declaring_more_elements_than_the_file_can_hold_is_refused(tmp_path: Path) -> None:
    info = _s("token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 2**40, 2**20) + struct.pack("<IQ", 0, 0)
    r = _import_gguf(tmp_path, gguf_bytes(llama_metadata(), tensors=1, tensor_infos=info))
    assert r.code == 2 and "token_embd.weight" in r.text and "elements" in r.text, r.text


# ---------------------------------------------------------------------------- import hf


def _hf(tmp_path: Path, **config: Any) -> Path:
    cfg = {**tiny_config("llama"), **config}
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("scaling", [LLAMA3_SCALING, {"rope_type": "linear", "factor": 2.0}], ids=["llama3", "linear"])
def test_import_hf_refuses_a_head_dim_of_1e12_naming_the_field_and_limit(tmp_path: Path, scaling: Any) -> None:
    d = _hf(tmp_path, head_dim=10**12, rope_scaling=scaling)
    r = run_bounded("import", "hf", d, tmp_path / "out", "--key", TEST_KEY)
    assert r.code == 2, r.text
    assert "config.json" in r.text and "head_dim" in r.text and "1000000000000" in r.text, r.text
    assert f"{limits.MAX_HEAD_DIM.maximum:,}" in r.text, r.text


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def test_import_hf_refuses_a_config_json_nested_100000_deep(tmp_path: Path) -> None:
    d = _hf(tmp_path)
    (d / "config.json").write_text(_deep(100_000))
    r = run_bounded("import", "hf", d, tmp_path / "out", "--key", TEST_KEY)
    assert (
        r.code == 2 and "config.json" in r.text and "levels deep, more than the 64 a JSON document may nest" in r.text
    ), r.text


def test_import_hf_refuses_a_safetensors_header_nested_100000_deep(tmp_path: Path) -> None:
    d = _hf(tmp_path)
    header = ("[" * 100_000 + "]" * 100_000).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    r = run_bounded("import", "hf", d, tmp_path / "out", "--key", TEST_KEY)
    assert (
        r.code == 2
        and "model.safetensors" in r.text
        and "levels deep, more than the 64 a JSON document may nest" in r.text
    ), r.text


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path: Path) -> None:
    from calctl import jsonsafe

    doc = {"chat_template": "[" * 10_000 + '\\"{' * 100, "deep": [[[1]]]}
    assert jsonsafe.nesting_depth(json.dumps(doc).encode()) == 4
    assert jsonsafe.loads(json.dumps(doc)) == doc


# ---------------------------------------------------------------------------- budget --hf-config


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_hidden_layers", 2**31 - 1), ("num_hidden_layers", 10**8), ("num_attention_heads", 2**20)],
)
def test_budget_hf_config_refuses_a_count_over_the_limit_naming_field_value_and_limit(
    tmp_path: Path, key: str, value: int
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**tiny_config("llama"), key: value}))
    r = run_bounded("budget", "--hf-config", cfg)
    limit = limits.limit_of(key)
    assert r.code == 2, r.text
    assert str(cfg) in r.text and key in r.text and str(value) in r.text and f"{limit.maximum:,}" in r.text, r.text


def test_budget_hf_config_refuses_a_config_nested_100000_deep(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(_deep(100_000))
    r = run_bounded("budget", "--hf-config", cfg)
    assert r.code == 2 and "levels deep, more than the 64 a JSON document may nest" in r.text, r.text


def test_import_hf_refuses_a_fifo_named_safetensors_without_blocking(tmp_path: Path) -> None:
    import os

    d = _hf(tmp_path)
    (d / "model.safetensors").unlink()
    os.mkfifo(d / "model.safetensors")
    r = run_bounded("import", "hf", d, tmp_path / "out", "--key", TEST_KEY)
    assert r.code == 2 and "model.safetensors: not a regular file" in r.text, r.text


def test_the_importers_tokenizer_limit_is_validates() -> None:
    from calctl.compiler.importer import hf
    from calctl.package.rules import context

    assert hf.MAX_TOKENIZER_BYTES == context.MAX_TOKENIZER_BYTES
