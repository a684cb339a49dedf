"""Every token id a tokenizer can produce (issue 54: the package's rules check ids by value, not by count).

Pure functions over a loaded ``tokenizers.Tokenizer``: the package rules (TOK002) and the importer both call
them; the tokenizer model itself (:mod:`calctl.model.tokenizer`) builds tokenizers and knows nothing of this.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tokenizers import Tokenizer


def produced_ids(tok: Tokenizer) -> Iterator[tuple[int, str]]:
    """Every ``(id, where)`` a loaded tokenizer can emit: its vocabulary and added (special) tokens, and the ids
    its post-processor inserts (TemplateProcessing ``special_tokens``, Bert/Roberta ``cls``/``sep``).

    A BPE merge's result is a vocabulary entry (``tokenizers`` refuses a merge whose result it lacks), so the
    vocabulary covers merges. Issue 54: a check by count (``get_vocab_size``) let one id of 1,000,000 through.
    """
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        yield int(i), f"token {text!r}"
    processor = tok.post_processor
    if processor is not None:
        yield from _processor_ids(json.loads(processor.__getstate__()), "post_processor")


def _processor_ids(node: Any, where: str) -> Iterator[tuple[int, str]]:
    """Every id in a serialised post-processor, however deeply its Sequences nest (a walk with its own stack:
    no level is skipped, and no recursion limit is reached)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key == "ids" and isinstance(value, list):
                yield from ((int(v), f"{where} special token") for v in value if isinstance(v, int))
            elif key in ("cls", "sep") and isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
                yield int(value[1]), f"{where} {key} {value[0]!r}"
            else:
                stack.append(value)


def ids_outside(tok: Tokenizer, bound: int, *, shown: int = 3) -> tuple[int, list[str]]:
    """How many ids ``tok`` can produce that are not in ``[0, bound)``, and the first ``shown`` of them named."""
    bad = [(i, where) for i, where in produced_ids(tok) if not 0 <= i < bound]
    bad.sort()
    return len(bad), [f"id {i} ({where})" for i, where in bad[-shown:][::-1]]


__all__ = ["ids_outside", "produced_ids"]
