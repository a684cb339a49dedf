"""calctl.limits is the one table of declared-number limits: the manifest schema states the same maxima, and
docs/validate.md "Limits" names every entry (issue 54)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from calctl import jsonsafe, limits
from calctl.compiler.importer import gguf_header
from calctl.package import schemas, yamlsafe

DOCS = Path(__file__).resolve().parents[2] / "docs" / "validate.md"

#: Manifest fields (section, name) whose value is a fact of the table.
MANIFEST_FIELDS = [
    *(
        ("architecture", n)
        for n in (
            "n_layers",
            "d_model",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "vocab_size",
            "context_limit",
            "max_position_embeddings",
            "eos_token_id",
            "bos_token_id",
        )
    ),
    ("tokenizer", "vocab_size"),
    ("kv", "block_tokens"),
    ("kv", "max_sequences"),
]


def _limits_section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    return text[text.index("## Limits") : text.index("## Terminal safety")]


@pytest.mark.parametrize(("section", "name"), MANIFEST_FIELDS)
def test_the_manifest_schema_states_the_tables_maximum(section: str, name: str) -> None:
    props = schemas.load_schema("calculet-package/v1")["properties"]["models"]["items"]["properties"]
    limit = limits.limit_of(name)
    assert limit is not limits.MAX_COUNT, name
    expected = limit.maximum - 1 if name.endswith("_token_id") else limit.maximum
    assert props[section]["properties"][name]["maximum"] == expected


def test_docs_validate_limits_names_every_entry_of_the_table() -> None:
    section = _limits_section()
    missing = [f"limits.{lim.name}" for lim in limits.LIMITS if f"`limits.{lim.name}`" not in section]
    assert not missing, missing
    for lim in limits.LIMITS:  # the figure next to the name is the table's
        row = re.search(rf"(\d{{1,3}}(?:,\d{{3}})*|2³¹−1)[^|`(\d]*\(`limits\.{lim.name}`", section)
        assert row, lim.name
        figure = row.group(1)
        assert figure == "2³¹−1" if lim.maximum == 2**31 - 1 else int(figure.replace(",", "")) == lim.maximum


def test_docs_validate_limits_names_the_document_and_gguf_bounds() -> None:
    section = _limits_section()
    for name, value in [
        ("jsonsafe.MAX_DEPTH", jsonsafe.MAX_DEPTH),
        ("yamlsafe.MAX_DEPTH", yamlsafe.MAX_DEPTH),
        ("jsonsafe.MAX_INT_DIGITS", jsonsafe.MAX_INT_DIGITS),
        ("jsonsafe.MAX_VALUES", jsonsafe.MAX_VALUES),
        ("jsonsafe.MAX_NUMBER_DIGITS", jsonsafe.MAX_NUMBER_DIGITS),
        ("gguf_header.MAX_KEY_BYTES", gguf_header.MAX_KEY_BYTES),
        ("gguf_header.MAX_ARRAY_NESTING", gguf_header.MAX_ARRAY_NESTING),
        ("gguf_header.MAX_TENSOR_DIMS", gguf_header.MAX_TENSOR_DIMS),
        ("gguf_header.MAX_ELEMENTS_PER_BYTE", gguf_header.MAX_ELEMENTS_PER_BYTE),
        ("gguf_header.MAX_STRING_BYTES", gguf_header.MAX_STRING_BYTES),
    ]:
        assert f"`{name}`" in section, name
        assert f"{value:,}" in section, (name, value)


def test_every_field_spelling_maps_to_a_listed_limit() -> None:
    assert set(limits.BY_FIELD.values()) <= set(limits.LIMITS)
    assert limits.over_limit("n_layers", 1024) is None
    assert "1,024" in (limits.over_limit("block_count", 1025) or "")
    assert limits.over_limit("eos_token_id", limits.MAX_VOCAB.maximum - 1) is None
    assert limits.over_limit("eos_token_id", limits.MAX_VOCAB.maximum)


def test_docs_validate_limits_names_every_range_with_its_figures() -> None:
    section = _limits_section()
    for r in limits.RANGES:
        row = re.search(rf"([\d.e+-]+) to ([\d.e+-]+) \(`limits\.{r.name}`", section)
        assert row, r.name
        assert (float(row.group(1)), float(row.group(2))) == (r.minimum, r.maximum), r.name


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("factor", 1e308),
        ("factor", float("inf")),
        ("factor", float("nan")),
        ("factor", -0.0),
        ("factor", 0.5),
        ("factor", True),
        ("factor", "8"),
        ("factor", None),
        ("rope_theta", 1e11),
        ("rope_theta", 10**40),
        ("low_freq_factor", 0.0),
    ],
)
def test_a_rope_figure_outside_its_range_is_named_with_the_range(field: str, value: object) -> None:
    message = limits.out_of_range(field, value)
    assert message and repr(value) in message


def test_rope_figures_within_range_pass() -> None:
    assert limits.out_of_range("factor", 8) is None
    assert limits.out_of_range("rope_theta", 500000.0) is None
    assert limits.out_of_range("high_freq_factor", 4.0) is None
    assert set(limits.RANGE_BY_FIELD.values()) <= set(limits.RANGES)
