"""Issue 54: every id a tokenizer can produce, found by value: vocabulary, added tokens and post-processor ids,
however deeply the post-processor's Sequences nest."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer

from calctl.package.tokenizer_ids import ids_outside
from tests.conftest import FIXTURE_PACKAGES

SOURCE = FIXTURE_PACKAGES / "combined" / "tokenizer" / "model-a" / "tokenizer.json"


def _with(**parts: Any) -> Tokenizer:
    doc = json.loads(SOURCE.read_text())
    doc.update(parts)
    return Tokenizer.from_str(json.dumps(doc))


def test_the_fixture_tokenizer_produces_only_ids_inside_its_vocabulary() -> None:
    assert ids_outside(Tokenizer.from_str(SOURCE.read_text()), 384) == (0, [])


def test_an_id_inside_sequences_nested_40_deep_is_found() -> None:
    processor: dict[str, Any] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [70000], "tokens": ["<s>"]}},
    }
    for _ in range(40):
        processor = {"type": "Sequence", "processors": [processor]}
    assert ids_outside(_with(post_processor=processor), 384) == (1, ["id 70000 (post_processor special token)"])


def test_bert_style_cls_and_sep_ids_are_checked() -> None:
    processor = {"type": "BertProcessing", "sep": ["<|im_end|>", 5000], "cls": ["<|im_start|>", 1]}
    count, named = ids_outside(_with(post_processor=processor), 384)
    assert count == 1 and named == ["id 5000 (post_processor sep '<|im_end|>')"]


def test_an_added_token_past_the_vocabulary_is_found() -> None:
    doc = json.loads(SOURCE.read_text())
    extra = {"content": "<tool>", "id": 9999, "special": True}
    extra |= {"lstrip": False, "rstrip": False, "single_word": False, "normalized": False}
    tok = _with(added_tokens=[*doc["added_tokens"], extra])
    # tokenizers gives an added token the next free id (384 here), whatever id the file states: still outside.
    assert ids_outside(tok, 384) == (1, ["id 384 (token '<tool>')"])
