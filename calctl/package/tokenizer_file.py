"""A ``tokenizer.json`` is measured before the tokenizers library reads it (issue 54).

The library builds its whole vocabulary, merge table and added-token matcher
when it loads a file: an 82 MB ``tokenizer.json`` of 4 million vocabulary
entries cost it 16 s and 1.1 GB, in ``validate``, ``import hf`` and ``serve``
alike, before any check on the result could run. :func:`check` refuses such a
file from its bytes, in bounded time and memory:

* at most :data:`MAX_TOKENIZER_BYTES` bytes (twice Gemma 3's 33 MB; Llama 3's
  is 9 MB);
* the bounded JSON scan of :mod:`calctl.jsonsafe` (depth, digits) with a value
  budget of a tokenizer at the table's limits (:data:`MAX_VALUES`), and no
  array/object holding more entries than its part of a tokenizer may:
  ``vocab`` within ``limits.MAX_VOCAB``, ``merges`` within
  ``limits.MAX_MERGES``, ``added_tokens`` within ``limits.MAX_ADDED_TOKENS``,
  anything else within :data:`MAX_OTHER_ENTRIES`.

Every path that loads a tokenizer calls :func:`read` or :func:`check` first: the
package reader (TOK001), ``import hf`` and the serving text codec. This module
reads at most one file and loads nothing; callers turn :class:`TokenizerRefused`
into their own error (exit 1 for a package, 2 for an input file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from calctl import jsonsafe, limits

#: Largest ``tokenizer.json`` read: Gemma 3's is 33 MB, Llama 3's 9 MB; a tokenizer at the table's limits
#: (1,048,576 entries and as many merges) is about 35 MB.
MAX_TOKENIZER_BYTES = 64 * 1024**2
#: Entries of any other array or object (pre-tokenizer lists, post-processor tokens): real ones hold a few dozen.
MAX_OTHER_ENTRIES = 65536
#: Values (openings and commas) of a tokenizer at the table's limits: a Unigram vocabulary's ``[piece, score]``
#: pairs and the ``[left, right]`` form of merges count 3 a entry, an added token's object 8.
MAX_VALUES = 3 * limits.MAX_VOCAB.maximum + 3 * limits.MAX_MERGES.maximum + 8 * limits.MAX_ADDED_TOKENS.maximum

_BY_KEY: dict[str, limits.Limit] = {
    "vocab": limits.MAX_VOCAB,
    "merges": limits.MAX_MERGES,
    "added_tokens": limits.MAX_ADDED_TOKENS,
}


class TokenizerRefused(ValueError):
    """A ``tokenizer.json`` over one of this module's bounds; the message names the part, the count and the limit."""


#: Merges a tokenizer may hold per vocabulary entry the model declares (Llama 3: 280,147 for 128,256, 2.2).
MERGES_PER_ENTRY = 4


def check(data: bytes, vocab_size: int | None = None) -> None:
    """Raise :class:`TokenizerRefused` if ``data`` (a whole ``tokenizer.json``) is over a bound; the scan stops at
    the first 256 KiB piece that crosses one. ``vocab_size``, when the caller knows the model's (the manifest's,
    ``config.json``'s), tightens the bounds to that model: at most that many vocabulary entries and added tokens,
    :data:`MERGES_PER_ENTRY` merges an entry; a tokenizer larger than its model cannot pass TOK002 anyway, and is
    refused before the library spends memory in proportion to it."""
    if len(data) > MAX_TOKENIZER_BYTES:
        raise TokenizerRefused(_too_big(len(data)))
    tops = {key: limit.maximum for key, limit in _BY_KEY.items()}
    if vocab_size is not None:
        n = max(1, vocab_size)
        tops = {
            "vocab": min(tops["vocab"], n),
            "added_tokens": min(tops["added_tokens"], n),
            "merges": min(tops["merges"], MERGES_PER_ENTRY * n + 1024),
        }

    def max_width(offset: int) -> int:
        return tops.get(jsonsafe.key_before(data, offset) or "", MAX_OTHER_ENTRIES)

    try:
        jsonsafe.check_widths(data, max_width, at_least=min(MAX_OTHER_ENTRIES, *tops.values()), max_values=MAX_VALUES)
    except jsonsafe.JsonRefused as exc:
        raise TokenizerRefused(_explained(exc, vocab_size)) from None


def _explained(exc: jsonsafe.JsonRefused, vocab_size: int | None) -> str:
    text = str(exc)
    if exc.kind == "width" and vocab_size is not None and f"more than {max(1, vocab_size):,}" in text:
        return f"{text}: more than the model's vocab_size of {vocab_size:,}; refused before it is loaded"
    if exc.kind == "width" and vocab_size is not None and "under key 'merges'" in text:
        return (
            f"{text}: more than {MERGES_PER_ENTRY} merges per entry of the model's vocab_size of {vocab_size:,} "
            "(calctl.package.tokenizer_file.MERGES_PER_ENTRY); refused before it is loaded"
        )
    if exc.kind == "width":
        for key, limit in _BY_KEY.items():
            if f"under key {key!r}" in text:
                return f"{text} {limit.fact} (calctl.limits.{limit.name}; {limit.why}); refused before it is loaded"
        return f"{text} (calctl.package.tokenizer_file.MAX_OTHER_ENTRIES); refused before it is loaded"
    if exc.kind == "values":
        return f"{text} (a tokenizer at the limits of calctl.limits holds fewer); refused before it is loaded"
    return f"{text}; refused before it is loaded"


def _too_big(size: int) -> str:
    return (
        f"is {size:,} bytes, over the {MAX_TOKENIZER_BYTES:,} a tokenizer.json may have "
        "(calctl.package.tokenizer_file.MAX_TOKENIZER_BYTES; Gemma 3's is 33 MB)"
    )


_ADDED = re.compile(rb'(?<=[{,\s])"added_tokens"\s*:\s*(?=\[)')
#: Candidate ``"added_tokens"`` keys tried (the top-level one comes first in every real file).
_MAX_CANDIDATES = 4
#: Bytes of the ``added_tokens`` array decoded at most (65,536 entries of about 150 bytes).
MAX_ADDED_TOKENS_BYTES = 16 * 1024**2


def declared_added_tokens(data: bytes) -> list[tuple[int, str, object]] | None:
    """``(index, content, id)`` of each entry of the file's ``added_tokens`` as the file states it, or None when
    the array cannot be read within :data:`MAX_ADDED_TOKENS_BYTES`. Only that array is decoded (the vocabulary of
    a million entries is never built into Python objects), after :func:`check` bounded it to
    ``limits.MAX_ADDED_TOKENS`` entries. Entries that are not objects with a string ``content`` are left out (the
    library refuses them when it loads the file)."""
    decoder = json.JSONDecoder()
    for n, m in enumerate(_ADDED.finditer(data)):
        if n >= _MAX_CANDIDATES:
            break
        text = data[m.end() : m.end() + MAX_ADDED_TOKENS_BYTES].decode("utf-8", "replace")
        try:
            value, _ = decoder.raw_decode(text)
        except ValueError:
            continue
        if isinstance(value, list):
            return [
                (i, e["content"], e.get("id"))
                for i, e in enumerate(value)
                if isinstance(e, dict) and isinstance(e.get("content"), str)
            ]
    return None


def read(path: Path, vocab_size: int | None = None) -> bytes:
    """``path``'s bytes, checked (:func:`check`); at most :data:`MAX_TOKENIZER_BYTES` + 1 are read whatever the
    file is (a FIFO, a file growing under the reader). Raises OSError or :class:`TokenizerRefused`."""
    with open(path, "rb") as f:
        data = f.read(MAX_TOKENIZER_BYTES + 1)
    check(data, vocab_size)
    return data
