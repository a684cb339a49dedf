"""Issue 54: every token id ``generation_config.json`` holds is checked against the vocabulary, the fields calctl
does not apply (decoder_start_token_id, suppress_tokens, bad_words_ids, forced_*) as well as EOS/BOS/PAD."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl.compiler.importer.families import CheckpointError
from calctl.compiler.importer.hf import read_hf_dir
from tests.unit.compiler.checkpoint_factory import write_hf_dir


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"decoder_start_token_id": 10**6}, r"decoder_start_token_id 1000000 is outside the vocabulary"),
        ({"suppress_tokens": [1, 10**6]}, r"suppress_tokens\[1\] 1000000 is outside"),
        ({"begin_suppress_tokens": [10**6]}, r"begin_suppress_tokens\[0\] 1000000 is outside"),
        ({"bad_words_ids": [[1, 2], [10**6]]}, r"bad_words_ids\[1\]\[0\] 1000000 is outside"),
        ({"forced_eos_token_id": 384}, r"forced_eos_token_id 384 is outside .*vocab_size 384"),
        ({"forced_bos_token_id": -1}, r"forced_bos_token_id: expected a token id >= 0"),
        ({"suppress_tokens": ["a"]}, r"suppress_tokens\[0\]: expected a token id >= 0 .*found 'a'"),
    ],
)
def test_a_generation_id_past_the_vocabulary_is_refused_naming_field_index_and_value(
    tmp_path: Path, doc: dict[str, object], match: str
) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, **doc}))
    with pytest.raises(CheckpointError, match=match):
        read_hf_dir(d)


def test_generation_ids_inside_the_vocabulary_import(tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    doc = {"eos_token_id": 2, "suppress_tokens": [5], "bad_words_ids": [[7, 8]], "forced_eos_token_id": None}
    (d / "generation_config.json").write_text(json.dumps(doc))
    assert read_hf_dir(d).config.eos_token_id is not None
