"""One bounded JSON loader for every JSON document a user hands calctl.

``config.json``, ``generation_config.json``, ``tokenizer_config.json``, a
safetensors header, ``--hf-config``, a package's ``compatibility.json`` and
``build-provenance.json``: all are parsed by :func:`loads`, which refuses before
parsing

* nesting deeper than :data:`MAX_DEPTH` (a 200 KB document nested 100,000 deep
  made Python's decoder raise RecursionError, exit 70, issue 54; a document a
  little under the interpreter's limit would parse and then crash whatever walks
  it recursively: jsonschema, ``repr``, ``json.dumps``), counted on the raw
  bytes with strings removed, so the scan costs a regex and a cumulative sum,
  never a Python frame per level;
* more than :data:`MAX_VALUES` values (counted as the commas and openings
  outside strings, on the same scan): a 100 MB safetensors header of tiny
  entries would build millions of Python objects, a GiB of memory, before any
  check on its content ran;
* integers of more than :data:`MAX_INT_DIGITS` digits (Python refuses to convert
  a long one back to text, so it would crash whatever prints it).

Errors are :class:`JsonRefused`, a ``ValueError`` (what ``json.loads`` raises),
whose message says what was refused and the limit; callers add the file name and
turn it into their own error (exit 1 for a package, 2 for an input file). This
module reads no files and knows no schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

#: Deepest nesting of arrays/objects accepted. Real documents: a tokenizer config 4, a safetensors header 3,
#: a provenance 5; the decoder itself recurses once a level.
MAX_DEPTH = 64
#: Most values one document may hold (``compatibility.json``/``build-provenance.json`` use the same figure,
#: ``reader.MAX_JSON_VALUES``): a safetensors header of 405B's largest shard holds ~2,000, a tokenizer config
#: of 6,000 added tokens ~50,000.
MAX_VALUES = 200_000
#: Longest integer literal accepted (2**64 has 20 digits); the same figure as YAML's ``yamlsafe.MAX_INT_DIGITS``.
MAX_INT_DIGITS = 40

# A JSON string: quote, then runs of plain characters or escapes, then quote (linear: no nested quantifier
# can match the same text two ways).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_CHUNK = 8 * 1024 * 1024


class JsonRefused(ValueError):
    """A JSON document over one of this module's limits (a ValueError, as ``json.loads`` raises); ``kind`` is
    ``depth``, ``values`` or ``digits``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def structure(data: bytes) -> tuple[int, int]:
    """``(deepest nesting, values)`` of ``data`` counted outside strings: ``[``/``{`` open a level, and every
    opening and comma starts a value (bounded memory: 8 MiB pieces)."""
    marks = _STRING.sub(b"", data).translate(None, _NOT_STRUCTURE)
    values = 1 + marks.count(b",") + marks.count(b"[") + marks.count(b"{")
    return _deepest(marks.translate(None, b",")), values


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in ``data`` outside strings."""
    return structure(data)[0]


def _deepest(brackets: bytes) -> int:
    depth, deepest = 0, 0
    for start in range(0, len(brackets), _CHUNK):
        steps = _STEP[np.frombuffer(brackets, dtype=np.uint8, count=min(_CHUNK, len(brackets) - start), offset=start)]
        running = np.cumsum(steps, dtype=np.int64) + depth
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
    return deepest


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonRefused(f"a number of {digits} digits (integers of at most {MAX_INT_DIGITS} are accepted)", "digits")
    return int(text)


def check_structure(data: bytes, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> None:
    """Raise :class:`JsonRefused` if ``data`` nests deeper than ``max_depth`` or holds over ``max_values`` values."""
    depth, values = structure(data)
    if depth > max_depth:
        raise JsonRefused(f"nested {depth} levels deep, more than the {max_depth} a JSON document may nest", "depth")
    if values > max_values:
        raise JsonRefused(f"about {values:,} values, more than the {max_values:,} a JSON document may hold", "values")


def loads(data: bytes | str, **hooks: Any) -> Any:
    """Parse one JSON document after the depth check; ``hooks`` go to ``json.loads`` (``object_pairs_hook``, ...).

    Raises :class:`JsonRefused`, ``json.JSONDecodeError`` or ``UnicodeDecodeError``: all ``ValueError``.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    check_structure(raw)
    text = data if isinstance(data, str) else raw.decode("utf-8")
    hooks.setdefault("parse_int", _bounded_int)
    try:
        return json.loads(text, **hooks)
    except RecursionError:  # not reached below MAX_DEPTH; kept so no input can end in a traceback
        raise JsonRefused(f"nested more deeply than Python's decoder can follow (limit {MAX_DEPTH})", "depth") from None
