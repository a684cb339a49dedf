"""Issue 54: what a GGUF's numbers mean is checked by value: tensor data neither overlaps nor sits off the
alignment, names are UTF-8, every token id list lies inside the vocabulary, token types and scores are what
llama.cpp reads, flags are BOOL, and a RoPE factor without a type is linear scaling (llama.cpp's rule)."""

from __future__ import annotations

import shutil
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calctl.compiler.importer.build import read_gguf_file
from calctl.compiler.importer.families import CheckpointError
from tests.unit.compiler.test_gguf_declared import _gguf


def _set(key: str, value: Any, vtype: str, sub: str | None = None) -> Any:
    import gguf

    def edit(kvs: dict[str, Any]) -> None:
        kvs[key] = (value, gguf.GGUFValueType[vtype], gguf.GGUFValueType[sub] if sub else None)

    return edit


def _retarget(src: Path, dst: Path, index: int, offset: Any) -> Path:
    """``src`` copied to ``dst`` with tensor ``index``'s data offset set to ``offset(tensors)``."""
    import gguf

    shutil.copy(src, dst)
    r = gguf.GGUFReader(str(dst), "r+")
    r.tensors[index].field.parts[-1][0] = offset(r.tensors)
    r.data.flush()
    del r
    return dst


def test_two_tensors_sharing_bytes_are_refused_naming_both(tmp_path: Path) -> None:
    src = _gguf(tmp_path)
    bad = _retarget(src, tmp_path / "o.gguf", 1, lambda ts: int(ts[0].field.parts[-1][0]))
    with pytest.raises(CheckpointError, match=r"tensors \S+ \(data offset 0, bytes up to [\d,]+\) and \S+ .*overlap"):
        read_gguf_file(bad)


def test_a_tensor_offset_off_the_alignment_is_refused_naming_tensor_and_offset_without_a_warning(
    tmp_path: Path,
) -> None:
    src = _gguf(tmp_path)
    bad = _retarget(src, tmp_path / "a.gguf", 1, lambda ts: int(ts[1].field.parts[-1][0]) + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here instead of reaching a terminal
        with pytest.raises(CheckpointError, match=r"data offset [\d,]+ is not a multiple of general.alignment 32"):
            read_gguf_file(bad)


def test_a_key_name_that_is_not_utf8_is_refused_naming_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "k.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc" + b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"metadata key 0: name: its bytes are not valid UTF-8 .*offset 32"):
        read_gguf_file(path)


def test_an_id_list_past_the_vocabulary_is_refused_naming_key_index_and_value(tmp_path: Path) -> None:
    edit = _set("tokenizer.ggml.eot_token_ids", [2, 10**6], "ARRAY", "UINT32")
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.eot_token_ids\[1\] = 1000000 is outside"):
        read_gguf_file(_gguf(tmp_path, edit))


def test_a_flag_stored_as_a_number_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"add_bos_token: expected a BOOL .*found 5 \(int\)"):
        read_gguf_file(_gguf(tmp_path, _set("tokenizer.ggml.add_bos_token", 5, "UINT32")))


def test_a_token_type_llama_cpp_does_not_know_is_refused(tmp_path: Path) -> None:
    def edit(kvs: dict[str, Any]) -> None:
        v, a, b = kvs["tokenizer.ggml.token_type"]
        kvs["tokenizer.ggml.token_type"] = ([999, *list(v)[1:]], a, b)

    with pytest.raises(CheckpointError, match=r"token_type\[0\] = 999: expected one of llama.cpp's token types"):
        read_gguf_file(_gguf(tmp_path, edit))


@pytest.mark.parametrize(
    ("scores", "match"),
    [(None, r"scores\[0\] = nan: expected a finite number"), ([0.0] * 3, r"scores holds 3 entries.*384")],
)
def test_scores_not_one_finite_number_per_token_are_refused(
    tmp_path: Path, scores: list[float] | None, match: str
) -> None:
    import gguf

    def edit(kvs: dict[str, Any]) -> None:
        n = len(kvs["tokenizer.ggml.tokens"][0])
        values = scores if scores is not None else [float("nan")] * n
        kvs["tokenizer.ggml.scores"] = (values, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)

    with pytest.raises(CheckpointError, match=match):
        read_gguf_file(_gguf(tmp_path, edit))


def test_a_rope_factor_without_a_type_is_linear_scaling_as_in_llama_cpp(tmp_path: Path) -> None:
    ck = read_gguf_file(_gguf(tmp_path, _set("llama.rope.scaling.factor", 4.0, "FLOAT32")))
    assert ck.config.rope_factors == (4.0,) * (ck.config.head_dim // 2)
    assert np.array_equal(ck.params["rope_freq_factors"], np.full(ck.config.head_dim // 2, 4.0, np.float32))
    assert not any("rope.scaling.factor" in note for note in ck.notes)


def test_a_rope_factor_without_a_type_is_held_to_the_factor_range(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"llama\.rope\.scaling\.factor: .* is outside 1..1024.*absent"):
        read_gguf_file(_gguf(tmp_path, _set("llama.rope.scaling.factor", 1e30, "FLOAT32")))
