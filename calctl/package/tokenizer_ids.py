"""Every token id a tokenizer can produce (issue 54: the package's rules check ids by value, not by count).

Pure functions over a loaded ``tokenizers.Tokenizer``: the package rules (TOK002) and the importer both call
them; the tokenizer model itself (:mod:`calctl.model.tokenizer`) builds tokenizers and knows nothing of this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from tokenizers import Tokenizer

from calctl import textsafe


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


def vocabulary_problems(tok: Tokenizer, *, shown: int = 3) -> list[str]:
    """What is wrong with a loaded tokenizer's vocabulary by value, one sentence each (empty: nothing): an id two
    tokens share, ids below the entry count that no token has (the entries of a vocabulary of n are the ids
    0..n-1: a gap is a token id the model has weights for and the tokenizer can never produce, or one two texts
    decode to), and a ``model.unk_token`` that is not in the vocabulary (every unknown character would map to a
    token that does not exist). Issue 54: ``model.vocab`` with one id twice and one missing validated PASS."""
    vocab = tok.get_vocab(with_added_tokens=True)
    n = len(vocab)
    out: list[str] = []
    by_id: dict[int, list[str]] = {}
    for text, i in vocab.items():
        by_id.setdefault(int(i), []).append(text)
    shared = sorted((i, sorted(texts)) for i, texts in by_id.items() if len(texts) > 1)
    if shared:
        named = "; ".join(f"id {i} for {', '.join(repr(t) for t in texts[:3])}" for i, texts in shared[:shown])
        out.append(f"{len(shared)} token id(s) used by more than one token: {named}; expected one token per id")
    missing = [i for i in range(n) if i not in by_id]
    if missing:
        listed = ", ".join(str(i) for i in missing[:shown]) + (", ..." if len(missing) > shown else "")
        out.append(
            f"{len(missing)} id(s) below its {n:,} entries have no token ({listed}); expected the ids 0..{n - 1}, "
            "each once"
        )
    unk = getattr(tok.model, "unk_token", None)
    if isinstance(unk, str) and unk and tok.token_to_id(unk) is None:
        out.append(f"model.unk_token {unk[:60]!r} is not in the vocabulary; expected one of its tokens (or null)")
    return out


#: ``tokenizer_config.json`` keys naming one special token by its text (transformers' ``SPECIAL_TOKENS_ATTRIBUTES``).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_ID_KEY = re.compile(r"[0-9]{1,20}")


def token_text(value: object) -> str | None:
    """A special token's text: a string, or an AddedToken object's ``content``; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def unknown_special_tokens(doc: Mapping[str, Any], tok: Tokenizer) -> Iterator[tuple[str, str]]:
    """``(field, problem)`` for each special token ``tokenizer_config.json`` names that the tokenizer does not have
    (issue 54: an unknown ``eos_token`` imported, and the package then failed TOK004), or that is not a token at all.

    transformers would add such a token with a new id past the tokenizer's (and maybe the model's) vocabulary;
    calctl's tokenizer never produces it, so generation would never stop on it."""
    listed: list[tuple[str, object]] = [(k, doc[k]) for k in SPECIAL_TOKEN_KEYS if doc.get(k) is not None]
    extra = doc.get("additional_special_tokens")
    if extra is not None and not isinstance(extra, list):
        yield "additional_special_tokens", f"expected a list of tokens, found {type(extra).__name__}"
    elif extra:
        listed += [(f"additional_special_tokens[{i}]", v) for i, v in enumerate(extra)]
    for field, value in listed:
        text = token_text(value)
        if text is None:
            yield field, f"expected a token (a string or an object with a string content), found {_short(value)}"
        elif tok.token_to_id(text) is None:
            yield field, f"{_short(text)} is not a token of the tokenizer (tokenizer.json)"


def decoder_id_problems(doc: Mapping[str, Any], tok: Tokenizer, bound: int) -> Iterator[tuple[str, str]]:
    """``(field, problem)`` for each ``added_tokens_decoder`` entry whose id is not an integer below ``bound`` (the
    vocabulary) or whose token the tokenizer lacks or holds under another id (issue 54: ids past the vocabulary
    passed validate and import; transformers adds them as they are declared)."""
    decoder = doc.get("added_tokens_decoder")
    if decoder is None:
        return
    if not isinstance(decoder, Mapping):
        yield "added_tokens_decoder", f"expected an object of id -> token, found {type(decoder).__name__}"
        return
    for key, value in decoder.items():
        field = f"added_tokens_decoder[{_short(key)}]"
        if not _ID_KEY.fullmatch(key):
            yield field, f"the key {_short(key)} is not a token id (decimal digits)"
            continue
        i = int(key)
        if i >= bound:
            yield field, f"id {i} is outside the vocabulary of {bound} entries (ids 0..{bound - 1})"
            continue
        text = token_text(value)
        if text is None:
            yield field, f"expected an object with a string content, found {_short(value)}"
            continue
        got = tok.token_to_id(text)
        if got != i:
            where = "is not in tokenizer.json" if got is None else f"has id {got} in tokenizer.json"
            yield field, f"token {_short(text)} {where}, not {i}"


def added_id_problems(declared: list[tuple[int, str, object]], tok: Tokenizer) -> Iterator[tuple[str, str]]:
    """``(field, problem)`` for each ``added_tokens`` entry of tokenizer.json whose declared id is not the id the
    loaded tokenizer gives its token (issue 54): the tokenizers library ignores the file's ids and assigns its own,
    so a file saying ``{"id": 999, "content": "<x>"}`` serves ``<x>`` as another id than every other tool reads."""
    for index, content, declared_id in declared:
        got = tok.token_to_id(content)
        if isinstance(declared_id, bool) or not isinstance(declared_id, int) or got != declared_id:
            yield (
                f"added_tokens[{index}]",
                f"token {_short(content)} declares id {_short(declared_id)}, but the tokenizer gives it id {got}",
            )


def _short(value: object) -> str:
    return textsafe.shorten(repr(value))


__all__ = [
    "SPECIAL_TOKEN_KEYS",
    "added_id_problems",
    "decoder_id_problems",
    "ids_outside",
    "produced_ids",
    "token_text",
    "unknown_special_tokens",
]
