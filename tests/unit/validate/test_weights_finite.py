"""GOLD010's scan: non-finite values found by bit pattern in every float dtype and block scale, across chunk
boundaries, and a tensor that does not lie inside its file skipped with the reason (never a crash)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from calctl.package.model import ParamTensor
from calctl.package.rules import finite


def _blob(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\0" * 16 + data)
    return path


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_first_non_finite_value_is_named_by_index_and_value(
    tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finite, "CHUNK_BYTES", 64)  # many chunks: the index counts across them
    values = np.ones(200, dtype="<f4" if dtype == "fp32" else "<f2")
    values[150], values[170] = np.inf, np.nan
    path = _blob(tmp_path, values.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found, reason = finite.first_non_finite(path, ParamTensor("w", "blob.bin", dtype, (200,), 16))
    assert reason == "" and found == (150, "inf", 2)


def test_bf16_nan_is_found_from_its_bits(tmp_path: Path) -> None:
    bits = np.full(8, 0x3F80, dtype="<u2")  # 1.0
    bits[3] = 0x7FC0  # NaN
    path = _blob(tmp_path, bits.tobytes())
    found, _ = finite.first_non_finite(path, ParamTensor("w", "blob.bin", "bf16", (8,), 16))
    assert found == (3, "nan", 1)


def test_a_q8_0_block_with_an_infinite_scale_is_named_by_block(tmp_path: Path) -> None:
    blocks = np.zeros((4, 34), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    blocks[2, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), dtype=np.uint8)
    path = _blob(tmp_path, blocks.tobytes())
    found, _ = finite.first_non_finite(path, ParamTensor("w", "blob.bin", "q8_0", (32, 4), 16))
    assert found is not None and found[0] == 2 and "inf" in found[1]


def test_finite_values_pass_and_a_tensor_past_its_file_is_a_reason(tmp_path: Path) -> None:
    path = _blob(tmp_path, np.ones(8, dtype="<f4").tobytes())
    assert finite.first_non_finite(path, ParamTensor("w", "blob.bin", "fp32", (8,), 16)) == (None, "")
    found, reason = finite.first_non_finite(path, ParamTensor("w", "blob.bin", "fp32", (8,), 10**20))
    assert found is None and "GOLD005" in reason
