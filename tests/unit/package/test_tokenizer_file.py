"""A tokenizer.json is measured before the tokenizers library reads it (issue 54: 4 million vocabulary entries cost
the library 16 s and 1.1 GB): the widths of its parts, its values and its size, from the bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calctl import jsonsafe, limits
from calctl.package import tokenizer_file


def _doc(vocab: int = 10, merges: int = 0, added: int = 0, **extra: Any) -> bytes:
    doc = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": f"<a{i}>", "special": True} for i in range(added)],
        "model": {
            "type": "BPE",
            "vocab": {f"t{i}": i for i in range(vocab)},
            "merges": [f"t t{i}" for i in range(merges)],
        },
        **extra,
    }
    return json.dumps(doc).encode()


def _refused(data: bytes) -> str:
    with pytest.raises(tokenizer_file.TokenizerRefused) as info:
        tokenizer_file.check(data)
    return str(info.value)


def test_a_vocabulary_past_the_table_is_refused_naming_the_part_and_the_limit() -> None:
    text = _refused(_doc(vocab=limits.MAX_VOCAB.maximum + 1))
    assert "under key 'vocab'" in text and "calctl.limits.MAX_VOCAB" in text and "1,048,576" in text


def test_added_tokens_past_their_limit_are_refused() -> None:
    text = _refused(_doc(added=limits.MAX_ADDED_TOKENS.maximum + 1))
    assert "under key 'added_tokens'" in text and "calctl.limits.MAX_ADDED_TOKENS" in text


def test_any_other_part_is_held_to_the_smallest_limit_even_under_an_escaped_key() -> None:
    n = tokenizer_file.MAX_OTHER_ENTRIES + 1
    data = _doc().replace(b'"version"', b'"voc\\u0061b": [' + b",".join([b"1"] * n) + b'], "version"')
    assert "MAX_OTHER_ENTRIES" in _refused(data)


def test_a_file_past_the_byte_cap_is_refused_by_its_size() -> None:
    assert "MAX_TOKENIZER_BYTES" in _refused(b" " * (tokenizer_file.MAX_TOKENIZER_BYTES + 1))


def test_deep_nesting_is_refused() -> None:
    assert "levels deep" in _refused(b"[" * 100_000 + b"]" * 100_000)


def test_a_tokenizer_at_realistic_sizes_passes() -> None:
    tokenizer_file.check(_doc(vocab=262_144, merges=262_000, added=6_000))


def _widths(value: Any, out: list[int]) -> list[int]:
    if isinstance(value, list | dict):
        if len(value) >= 2:
            out.append(len(value))
        for v in value.values() if isinstance(value, dict) else value:
            _widths(v, out)
    return out


_json = st.recursive(
    st.none() | st.integers() | st.text(alphabet=',[]{}"\\ab', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=8) | st.dictionaries(st.text(alphabet=',[{"\\k', max_size=4), inner, max_size=8)
    ),
    max_leaves=60,
)


@settings(max_examples=200, deadline=None)
@given(doc=_json, chunk=st.sampled_from([1, 3, 7, 64, 1 << 18]))
def test_the_width_scan_counts_what_json_parses(doc: Any, chunk: int) -> None:
    """Every array/object's children, counted on the bytes piece by piece, are what the parser finds."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonsafe, "_CHUNK", chunk)
        widths = jsonsafe._Widths(2)
        jsonsafe._scan(json.dumps(doc).encode(), 1 << 60, 1 << 60, 1 << 60, widths)
    assert sorted(widths.wide.values()) == sorted(_widths(doc, []))


def test_the_models_declared_vocab_size_tightens_the_bounds() -> None:
    """A tokenizer larger than the model that declares it is refused before it is loaded (the library spent
    874 MB on one at the table's limits), naming the model's vocab_size."""
    data = _doc(vocab=5000, merges=100)
    tokenizer_file.check(data, vocab_size=5000)
    assert "the model's vocab_size of 4,096" in _refused_for(data, 4096)
    assert "merges per entry" in _refused_for(_doc(vocab=100, merges=2000), 100)


def _refused_for(data: bytes, vocab_size: int) -> str:
    with pytest.raises(tokenizer_file.TokenizerRefused) as info:
        tokenizer_file.check(data, vocab_size=vocab_size)
    return str(info.value)
