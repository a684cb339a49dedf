"""Issue 54: nothing a GGUF declares is used unchecked or dropped silently: every special-token id lies in the
vocabulary, every count within calctl.limits, the tensor table is exactly the family's, the tokens are distinct
and non-empty, and a bad RoPE factor is named by index and value."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calctl.compiler.importer.build import read_gguf_file
from calctl.compiler.importer.families import CheckpointError
from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING, tiny_config, write_gguf, write_hf_dir

Edit = Callable[[dict[str, tuple[Any, Any, Any]]], None]


def _gguf(tmp_path: Path, edit: Edit | None = None, tensors: dict[str, np.ndarray] | None = None, **cfg: Any) -> Path:
    """A valid llama GGUF written like llama.cpp's converter, its metadata edited by ``edit`` (key -> (value,
    type, array element type)) and ``tensors`` added or replaced."""
    import gguf

    config = {**tiny_config("llama"), **cfg}
    hf_dir, config, weights = write_hf_dir(tmp_path / "hf", "llama", config=config)
    src = write_gguf(tmp_path / "src.gguf", hf_dir, config, weights)
    reader = gguf.GGUFReader(str(src))
    kvs: dict[str, tuple[Any, Any, Any]] = {}
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        array = f.types[0] == gguf.GGUFValueType.ARRAY
        kvs[f.name] = (f.contents(), f.types[0], f.types[-1] if array else None)
    if edit:
        edit(kvs)
    out = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for name, (value, vtype, sub) in kvs.items():
        w.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name in (tensors or {}):
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(x) for x in t.shape])))
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _u32(value: int) -> tuple[int, Any, None]:
    import gguf

    return (value, gguf.GGUFValueType.UINT32, None)


def test_the_writer_of_these_cases_makes_a_file_that_imports(tmp_path: Path) -> None:
    ck = read_gguf_file(_gguf(tmp_path))
    assert ck.config.vocab_size == 384
    assert not any("tokenizer.ggml" in note for note in ck.notes)


@pytest.mark.parametrize("key", ["padding_token_id", "unknown_token_id", "eot_token_id", "bos_token_id"])
def test_a_special_token_id_past_the_vocabulary_is_refused_naming_key_value_and_vocabulary(
    tmp_path: Path, key: str
) -> None:
    def edit(kvs: dict[str, Any]) -> None:
        kvs[f"tokenizer.ggml.{key}"] = _u32(1_000_000)

    with pytest.raises(CheckpointError, match=rf"tokenizer\.ggml\.{key} 1000000 is outside the vocabulary"):
        read_gguf_file(_gguf(tmp_path, edit))


@pytest.mark.parametrize(
    ("value", "match"), [(10**6, r"over the limit of 4,096 MoE experts"), (8, "mixture of experts")]
)
def test_an_expert_count_is_refused_not_dropped(tmp_path: Path, value: int, match: str) -> None:
    def edit(kvs: dict[str, Any]) -> None:
        kvs["llama.expert_count"] = _u32(value)

    with pytest.raises(CheckpointError, match=rf"llama\.expert_count.*{match}"):
        read_gguf_file(_gguf(tmp_path, edit))


def test_an_integer_the_decoder_does_not_use_is_still_bounded(tmp_path: Path) -> None:
    import gguf

    def edit(kvs: dict[str, Any]) -> None:
        kvs["llama.some_window"] = (2**40, gguf.GGUFValueType.UINT64, None)

    with pytest.raises(CheckpointError, match=r"llama\.some_window: 1099511627776 is over the limit of 2,147,483,647"):
        read_gguf_file(_gguf(tmp_path, edit))


def test_metadata_calctl_does_not_use_is_reported_in_the_notes(tmp_path: Path) -> None:
    import gguf

    def edit(kvs: dict[str, Any]) -> None:
        kvs["general.name"] = ("tiny", gguf.GGUFValueType.STRING, None)
        kvs["tokenizer.ggml.scores"] = ([0.5] * 384, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)

    ck = read_gguf_file(_gguf(tmp_path, edit))
    (note,) = [n for n in ck.notes if "not used" in n]
    assert "general.name" in note and "tokenizer.ggml.scores" in note


@pytest.mark.parametrize(("index", "text", "match"), [(5, "", r"tokens\[5\] is an empty string"), (7, "dup", "")])
def test_an_empty_or_repeated_token_is_refused_naming_key_index_and_value(
    tmp_path: Path, index: int, text: str, match: str
) -> None:
    def edit(kvs: dict[str, Any]) -> None:
        tokens, vtype, sub = kvs["tokenizer.ggml.tokens"]
        tokens = list(tokens)
        if text:
            first = tokens[3]
            tokens[index] = first
        else:
            tokens[index] = ""
        kvs["tokenizer.ggml.tokens"] = (tokens, vtype, sub)

    expected = match or r"tokenizer\.ggml\.tokens\[7\] '.*' repeats tokenizer\.ggml\.tokens\[3\]"
    with pytest.raises(CheckpointError, match=expected):
        read_gguf_file(_gguf(tmp_path, edit))


def test_a_token_type_array_of_another_length_is_refused(tmp_path: Path) -> None:
    def edit(kvs: dict[str, Any]) -> None:
        types, vtype, sub = kvs["tokenizer.ggml.token_type"]
        kvs["tokenizer.ggml.token_type"] = (list(types)[:100], vtype, sub)

    with pytest.raises(CheckpointError, match=r"token_type holds 100 entries, tokenizer\.ggml\.tokens 384"):
        read_gguf_file(_gguf(tmp_path, edit))


def test_a_tensor_the_family_does_not_have_is_refused_by_name(tmp_path: Path) -> None:
    extra = {"blk.9.attn_q.weight": np.zeros((64, 64), np.float32)}
    with pytest.raises(CheckpointError, match=r"1 of them not part of a llama of 2 blocks \(blk\.9\.attn_q\.weight\)"):
        read_gguf_file(_gguf(tmp_path, tensors=extra))


@pytest.mark.parametrize("bad", [1e30, float("inf"), 0.0, -2.0])
def test_a_rope_factor_out_of_range_is_named_by_index_and_value(tmp_path: Path, bad: float) -> None:
    import gguf

    path = _gguf(tmp_path, rope_scaling=LLAMA3_SCALING)
    reader = gguf.GGUFReader(str(path))
    (freqs,) = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    data = bytearray(path.read_bytes())
    at = int(freqs.data_offset) + 3 * 4
    data[at : at + 4] = np.float32(bad).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=rf"rope_freqs\.weight\[3\] = {re.escape(f'{bad:.7g}')}: expected a factor from 1 to 1024"
    ):
        read_gguf_file(path)
