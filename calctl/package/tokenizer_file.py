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

_BY_KEY: dict[str | None, limits.Limit] = {
    "vocab": limits.MAX_VOCAB,
    "merges": limits.MAX_MERGES,
    "added_tokens": limits.MAX_ADDED_TOKENS,
}


class TokenizerRefused(ValueError):
    """A ``tokenizer.json`` over one of this module's bounds; the message names the part, the count and the limit."""


def check(data: bytes) -> None:
    """Raise :class:`TokenizerRefused` if ``data`` (a whole ``tokenizer.json``) is over a bound; the scan stops at
    the first 256 KiB piece that crosses one."""
    if len(data) > MAX_TOKENIZER_BYTES:
        raise TokenizerRefused(_too_big(len(data)))

    def max_width(offset: int) -> int:
        limit = _BY_KEY.get(jsonsafe.key_before(data, offset))
        return limit.maximum if limit is not None else MAX_OTHER_ENTRIES

    try:
        jsonsafe.check_widths(data, max_width, at_least=MAX_OTHER_ENTRIES, max_values=MAX_VALUES)
    except jsonsafe.JsonRefused as exc:
        raise TokenizerRefused(_explained(data, exc)) from None


def _explained(data: bytes, exc: jsonsafe.JsonRefused) -> str:
    text = str(exc)
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


def read(path: Path) -> bytes:
    """``path``'s bytes, checked; at most :data:`MAX_TOKENIZER_BYTES` + 1 are read whatever the file is (a FIFO, a
    file growing under the reader). Raises OSError or :class:`TokenizerRefused`."""
    with open(path, "rb") as f:
        data = f.read(MAX_TOKENIZER_BYTES + 1)
    check(data)
    return data
