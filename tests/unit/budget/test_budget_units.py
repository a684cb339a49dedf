"""Sizes and dtypes: what the options accept and how they fail."""

from __future__ import annotations

import pytest

from calctl.budget.units import DTYPE_BITS, canonical_dtype, parse_size
from calctl.errors import UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("0", 0),
        ("16GiB", 16 * 1024**3),
        ("16 GiB", 16 * 1024**3),
        ("16gib", 16 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GiB", 1610612736),  # 1.5 * 2**30
        ("64KiB", 65536),
        ("1TiB", 1024**4),
        ("1.5GB", 1_500_000_000),  # decimal units are 1000-based
        ("200MB", 200_000_000),
        ("10B", 10),
        ("0.1GiB", 107374182),  # 107374182.4: the fraction of a byte is dropped
    ],
)
def test_parse_size_accepts_binary_decimal_and_plain(text: str, expected: int) -> None:
    assert parse_size(text, "--x") == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("-1GiB", "negative"),
        ("-5", "negative"),
        ("lots", "not a size"),
        ("16G", "unknown unit"),  # ambiguous: refused, never guessed
        ("1e9", "not a size"),
        ("", "not a size"),
        ("2PiB", "more than 1 PiB"),
        ("12 parsecs", "unknown unit"),
    ],
)
def test_parse_size_rejects_garbage_naming_the_option(text: str, fragment: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_size(text, "--chip-dram")
    assert "--chip-dram" in str(err.value)
    assert fragment in str(err.value)


def test_parse_size_can_refuse_zero() -> None:
    with pytest.raises(UsageError, match="larger than zero"):
        parse_size("0GiB", "--chip-dram", allow_zero=False)


def test_dtype_widths_keep_int4_at_half_a_byte() -> None:
    assert {d: DTYPE_BITS[d] for d in ("bf16", "fp16", "fp8", "int8", "int4", "fp32")} == {
        "bf16": 16,
        "fp16": 16,
        "fp8": 8,
        "int8": 8,
        "int4": 4,
        "fp32": 32,
    }


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32"), ("BF16", "bf16"), ("float8_e4m3fn", "fp8")],
)
def test_hf_dtype_spellings_map_to_canonical(name: str, canonical: str) -> None:
    assert canonical_dtype(name, "torch_dtype") == canonical


def test_unknown_dtype_names_the_option_and_the_choices() -> None:
    with pytest.raises(UsageError) as err:
        canonical_dtype("fp64", "--kv-dtype", ("bf16", "int4"))
    assert "--kv-dtype" in str(err.value)
    assert err.value.hint == "one of: bf16, int4"
