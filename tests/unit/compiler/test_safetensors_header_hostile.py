"""Hostile safetensors headers and dtypes: a CheckpointError naming the file, never an internal error."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from calctl.compiler.importer.families import CheckpointError
from calctl.compiler.importer.hf import read_hf_dir
from tests.unit.compiler.checkpoint_factory import write_hf_dir


def _with_header(tmp: Path, header: object) -> Path:
    d, _, _ = write_hf_dir(tmp / "hf", "llama")
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    return d


@pytest.mark.parametrize(
    "header",
    [{"x": {"dtype": "F32", "shape": [1]}}, {"x": 5}, {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}],
    ids=["no-offsets", "entry-not-object", "one-offset"],
)
def test_a_header_entry_without_offsets_names_the_file(tmp_path: Path, header: object) -> None:
    d = _with_header(tmp_path, header)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: header entry 'x': (no )?data_offsets"):
        read_hf_dir(d)


@pytest.mark.parametrize(
    "offsets", [[-4, 0], [0.0, 4.0], [8, 4], [True, 4]], ids=["negative", "floats", "reversed", "bool"]
)
def test_wrong_data_offsets_are_quoted_with_what_was_expected(tmp_path: Path, offsets: list[object]) -> None:
    d = _with_header(tmp_path, {"x": {"dtype": "F32", "shape": [1], "data_offsets": offsets}})
    quoted = json.dumps(offsets).replace("[", r"\[").replace("]", r"\]").replace("true", "True")
    with pytest.raises(CheckpointError, match=rf"header entry 'x': data_offsets {quoted}; expected data_offsets"):
        read_hf_dir(d)


def test_an_integer_weight_is_refused_naming_the_tensor_and_dtype(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    weights = load_file(str(d / "model.safetensors"))
    weights["model.norm.weight"] = np.ones_like(weights["model.norm.weight"], dtype=np.int32)
    save_file(weights, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor model\.norm\.weight: dtype 'I32' is not a floating-point"):
        read_hf_dir(d)


def test_an_unused_integer_buffer_is_ignored(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    weights = load_file(str(d / "model.safetensors"))
    weights["model.some_buffer"] = np.arange(4, dtype=np.int64)
    save_file(weights, str(d / "model.safetensors"))
    read_hf_dir(d)


def test_an_f64_weight_past_float32s_range_is_refused_without_a_runtime_warning(tmp_path: Path) -> None:
    import warnings

    from safetensors.numpy import load_file, save_file

    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    weights = load_file(str(d / "model.safetensors"))
    weights["model.norm.weight"] = np.full_like(weights["model.norm.weight"], 1e300, dtype=np.float64)
    save_file(weights, str(d / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "overflow encountered in cast" used to reach the terminal
        with pytest.raises(CheckpointError, match=r"tensor model\.norm\.weight holds NaN or infinite values"):
            read_hf_dir(d)
