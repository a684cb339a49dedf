"""One bounded JSON loader for every JSON document a user hands calctl.

``config.json``, ``generation_config.json``, ``tokenizer_config.json``, a
safetensors header, ``--hf-config``, a package's ``compatibility.json`` and
``build-provenance.json``: all are parsed by :func:`loads`, which refuses before
parsing

* nesting deeper than :data:`MAX_DEPTH` (a 200 KB document nested 100,000 deep
  made Python's decoder raise RecursionError, exit 70, issue 54; a document a
  little under the interpreter's limit would parse and then crash whatever walks
  it recursively: jsonschema, ``repr``, ``json.dumps``);
* more than :data:`MAX_VALUES` values (counted as the commas and openings
  outside strings): a 100 MB safetensors header of tiny entries would build
  millions of Python objects, a GiB of memory, before any check on its content
  ran;
* a run of more than :data:`MAX_NUMBER_DIGITS` digits outside strings, and
  integers of more than :data:`MAX_INT_DIGITS` digits (Python refuses to convert
  a long one back to text, so it would crash whatever prints it).

The scan (:func:`structure`) walks the raw bytes in pieces of :data:`_CHUNK`
bytes with numpy, carrying its state (inside a string, a pending backslash run,
the depth) from one piece to the next: its extra memory is a few arrays of one
piece, whatever the document's size or shape, and it stops at the first piece
that crosses a limit (millions of empty strings in a 16 MB safetensors header
cost 1 GB in the ``re.sub`` this replaced, issue 54).

Errors are :class:`JsonRefused`, a ``ValueError`` (what ``json.loads`` raises),
whose message says what was refused and the limit; callers add the file name and
turn it into their own error (exit 1 for a package, 2 for an input file). This
module reads no files and knows no schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

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
#: Longest run of digits outside strings (a float's mantissa or exponent): Python prints a float in at most 17
#: significant digits; a megabyte of digits costs the decoder a megabyte-long conversion.
MAX_NUMBER_DIGITS = 1000

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_KIND = np.zeros(256, dtype=np.int8)  # 1 opening, 2 closing, 3 comma, 4 digit
_KIND[list(b"[{")] = 1
_KIND[list(b"]}")] = 2
_KIND[ord(",")] = 3
_KIND[list(b"0123456789")] = 4
_STEP = np.array([0, 1, -1, 0, 0], dtype=np.int64)
#: Bytes scanned at once: the scan's extra memory is about 20 bytes per byte of one piece (~5 MiB).
_CHUNK = 256 * 1024


class JsonRefused(ValueError):
    """A JSON document over one of this module's limits (a ValueError, as ``json.loads`` raises); ``kind`` is
    ``depth``, ``values`` or ``digits``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


_SHIFT = 40  # a mark's sort key is depth << _SHIFT | offset (documents are far below 2**40 bytes)
_OFFSET = (1 << _SHIFT) - 1


class _Widths:
    """How many children each array/object holds, tracked piece by piece in bounded memory (issue 54: a
    tokenizer.json of 4 million vocabulary entries cost the tokenizers library 16 s and 1.1 GB).

    A comma at depth ``d`` belongs to the most recent opening that made depth ``d``; only the latest container of
    each depth can still grow, so the state is one counter per depth plus the containers already over
    ``at_least`` (a tokenizer holds three or four: its vocabulary, merges and added tokens)."""

    def __init__(self, at_least: int) -> None:
        self.at_least = at_least
        self.current: dict[int, list[int]] = {}  # depth -> [opening offset, commas so far]
        self.wide: dict[int, int] = {}  # opening offset -> children, for containers of at least ``at_least``

    def piece(self, offsets: np.ndarray, kinds: np.ndarray, depths: np.ndarray) -> None:
        opens, commas = kinds == 1, kinds == 3
        if not commas.any():
            self._update_current(offsets[opens], depths[opens], None, None)
            return
        open_keys = (depths[opens].astype(np.int64) << _SHIFT) | offsets[opens]
        comma_depths = depths[commas].astype(np.int64)
        comma_keys = (comma_depths << _SHIFT) | offsets[commas]
        keys = np.concatenate((open_keys, comma_keys))
        is_open = np.concatenate((np.ones(len(open_keys), bool), np.zeros(len(comma_keys), bool)))
        order = np.argsort(keys, kind="stable")
        # For a comma: the latest opening of its depth in this piece, or (depth << _SHIFT) - 1 for "none here".
        values = np.where(is_open[order], keys[order], (keys[order] >> _SHIFT << _SHIFT) - 1)
        owners = np.maximum.accumulate(values)[~is_open[order]]
        owner_depths = keys[order][~is_open[order]] >> _SHIFT
        carried = owners < (owner_depths << _SHIFT)
        for d in np.unique(owner_depths[carried]).tolist():  # commas of a container opened in an earlier piece
            cur = self.current.get(int(d))
            if cur is not None:
                cur[1] += int(np.count_nonzero(owner_depths[carried] == d))
                self._note(cur[0], cur[1])
        local, counts = np.unique(owners[~carried], return_counts=True)
        wide = counts + 1 >= self.at_least
        for key, n in zip(local[wide].tolist(), counts[wide].tolist(), strict=True):
            self._note(key & _OFFSET, n)
        self._update_current(offsets[opens], depths[opens], local, counts)

    def _update_current(
        self, open_offsets: np.ndarray, open_depths: np.ndarray, local: np.ndarray | None, counts: np.ndarray | None
    ) -> None:
        if not len(open_offsets):
            return
        # The last opening of each depth in this piece is the one later commas of that depth may belong to.
        rev_depths = open_depths[::-1]
        uniq, first = np.unique(rev_depths, return_index=True)
        for d, i in zip(uniq.tolist(), first.tolist(), strict=True):
            offset = int(open_offsets[len(open_offsets) - 1 - i])
            n = 0
            if local is not None and counts is not None:
                key = (int(d) << _SHIFT) | offset
                j = int(np.searchsorted(local, key))
                n = int(counts[j]) if j < len(local) and int(local[j]) == key else 0
            self.current[int(d)] = [offset, n]

    def _note(self, offset: int, commas: int) -> None:
        if commas + 1 >= self.at_least:
            self.wide[offset] = commas + 1

    def widest(self) -> tuple[int, int] | None:
        """(opening offset, children) of the widest container over ``at_least`` seen so far."""
        return max(self.wide.items(), key=lambda kv: kv[1]) if self.wide else None


class _TopElements:
    """The offsets that end each element of a top-level array: its commas at depth 1, up to its closing bracket;
    and, through ``widths``, the width limits in the same pass."""

    def __init__(self, widths: _Widths) -> None:
        self.commas: list[np.ndarray] = []
        self.close = -1
        self.widths = widths

    def piece(self, offsets: np.ndarray, kinds: np.ndarray, depths: np.ndarray) -> None:
        self.widths.piece(offsets, kinds, depths)
        if self.close >= 0:
            return
        closes = offsets[(kinds == 2) & (depths == 0)]
        commas = offsets[(kinds == 3) & (depths == 1)]
        if len(closes):
            self.close = int(closes[0])
            commas = commas[commas < self.close]
        if len(commas):
            self.commas.append(commas)


#: What the scan reads: the document's bytes, or a seekable binary file read a piece at a time.
Source = bytes | BinaryIO


def _pieces(data: Source) -> Iterator[memoryview | bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            yield view[start : start + _CHUNK]
        return
    data.seek(0)
    while piece := data.read(_CHUNK):
        yield piece


def window(data: Source, start: int, end: int) -> bytes:
    """Bytes ``start:end`` of ``data`` (read from the file when it is one)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data[start:end])
    data.seek(start)
    return data.read(max(0, end - start))


@dataclass
class _Scan:
    """What one pass over the bytes knows at the end of a piece."""

    in_string: bool = False
    backslashes: int = 0  # the run of backslashes that ends the piece read so far
    depth: int = 0
    deepest: int = 0
    values: int = 1
    digits: int = 0  # the run of digits (outside strings) that ends the piece read so far
    longest_digits: int = 0
    widths: _Widths | _TopElements | None = None  # what sees the structural marks of each piece, if anything
    offset: int = 0  # of the piece being read, in the document

    def piece(self, a: np.ndarray) -> None:
        n = len(a)
        idx = np.arange(n, dtype=np.int32)
        # The last byte that is not a backslash, at or before each position (before the piece: the carried run).
        last = np.maximum.accumulate(np.where(a != _BACKSLASH, idx, -1 - self.backslashes))
        quotes = np.flatnonzero(a == _QUOTE)
        before = np.concatenate(([-1 - self.backslashes], last[:-1]))[quotes]
        real = quotes[(quotes - 1 - before) % 2 == 0]  # a quote after an even run of backslashes ends/opens a string
        self.backslashes = int(n - 1 - last[-1])
        del last, idx
        kinds = _KIND[a]
        marks = np.flatnonzero(kinds)
        # A mark lies outside strings when an even number of real quotes precede it (odd if one was open).
        outside = (np.searchsorted(real, marks) + self.in_string) % 2 == 0
        marks = marks[outside]
        self.in_string = bool((len(real) + self.in_string) % 2)
        mk = kinds[marks]
        self.values += int(np.count_nonzero(mk == 1) + np.count_nonzero(mk == 3))
        depth_before = self.depth
        brackets = mk[mk <= 2]
        if len(brackets):
            running = np.cumsum(_STEP[brackets]) + self.depth
            self.deepest = max(self.deepest, int(running.max()))
            self.depth = int(running[-1])
        self._digit_runs(marks[mk == 4], n)
        if self.widths is not None:
            self._widths(marks, mk, depth_before)
        self.offset += n

    def _widths(self, marks: np.ndarray, mk: np.ndarray, depth_before: int) -> None:
        assert self.widths is not None
        structural = mk != 4
        kinds = mk[structural]
        depths = np.cumsum(_STEP[kinds]) + depth_before  # after an opening: its inside; at a comma: its level
        self.widths.piece(marks[structural].astype(np.int64) + self.offset, kinds, depths)

    def _digit_runs(self, digits: np.ndarray, n: int) -> None:
        if not len(digits):
            self.digits = 0
            return
        breaks = np.flatnonzero(np.diff(digits) != 1) + 1  # where a new run starts
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [len(digits)]))
        lengths = ends - starts
        if digits[0] == 0:  # the first run continues the previous piece's
            lengths[0] += self.digits
        self.longest_digits = max(self.longest_digits, int(lengths.max()))
        self.digits = int(lengths[-1]) if digits[-1] == n - 1 else 0


def _scan(
    data: Source,
    max_depth: int,
    max_values: int,
    max_digits: int,
    widths: _Widths | _TopElements | None = None,
    max_width: Callable[[int], int] | None = None,
) -> _Scan:
    scan = _Scan(widths=widths)
    for piece in _pieces(data):
        scan.piece(np.frombuffer(piece, dtype=np.uint8))
        if scan.deepest > max_depth or scan.values > max_values or scan.longest_digits > max_digits:
            break
        counted = widths.widths if isinstance(widths, _TopElements) else widths
        if counted is not None and max_width is not None and _too_wide(counted, max_width) is not None:
            break
    return scan


def _too_wide(widths: _Widths, max_width: Callable[[int], int]) -> tuple[int, int, int] | None:
    for offset, n in sorted(widths.wide.items()):
        top = max_width(offset)
        if n > top:
            return offset, n, top
    return None


_KEY_BEFORE = re.compile(rb'"([^"\\\x00-\x1f]{1,64})"\s*:\s*\Z')


def key_before(data: Source, offset: int) -> str | None:
    """The object key whose value opens at ``offset`` (``"vocab": {``), or None (an array element, the top level,
    or a key spelled with escapes: callers then apply their strictest limit)."""
    m = _KEY_BEFORE.search(window(data, max(0, offset - 200), offset))
    return m.group(1).decode("utf-8", "replace") if m else None


def array_elements(data: Source, opening: int, max_children: Callable[[int], int], max_values: int) -> np.ndarray:
    """The element boundaries of the top-level JSON array of ``data`` that opens at byte ``opening``, found by the
    bounded scan, so a caller decodes one element at a time (memory in proportion to one element, not to the
    document): element ``i`` lies between boundaries ``i`` and ``i + 1`` (exclusive), the first boundary being
    ``opening`` and the last the closing bracket. Raises :class:`JsonRefused` if ``data`` is over
    :func:`check_widths`' limits, or ``ValueError`` if the array never closes. The last element is empty for
    ``[]`` (and for a trailing comma); any other empty element (``[1,,2]``) fails to decode, naming it."""
    tops = _TopElements(_Widths(min(max_children(opening), 1 << 16)))
    scan = _scan(data, MAX_DEPTH, max_values, MAX_NUMBER_DIGITS, tops, max_children)
    _refuse_wide(data, tops.widths, max_children)
    _raise_over(scan, MAX_DEPTH, max_values)
    if tops.close < 0:
        raise ValueError("the array never closes")
    return np.concatenate([np.array([opening], dtype=np.int64), *tops.commas, np.array([tops.close], dtype=np.int64)])


def check_widths(data: Source, max_width: Callable[[int], int], at_least: int, max_values: int) -> None:
    """Raise :class:`JsonRefused` (``kind`` ``width``, ``values`` or ``depth``) when an array/object of ``data``
    holds more children than ``max_width(offset of its opening)`` allows (asked only for containers of at least
    ``at_least`` children), the document more than ``max_values`` values, or nests deeper than :data:`MAX_DEPTH`;
    the scan stops at the first piece over a limit."""
    widths = _Widths(at_least)
    scan = _scan(data, MAX_DEPTH, max_values, MAX_NUMBER_DIGITS, widths, max_width)
    _refuse_wide(data, widths, max_width)
    _raise_over(scan, MAX_DEPTH, max_values)


def _refuse_wide(data: Source, widths: _Widths, max_width: Callable[[int], int]) -> None:
    over = _too_wide(widths, max_width)
    if over is not None:
        offset, n, top = over
        key = key_before(data, offset)
        where = f"the {'object' if window(data, offset, offset + 1) == b'{' else 'array'} " + (
            f"under key {key!r}" if key is not None else f"opening at byte {offset:,}"
        )
        raise JsonRefused(f"{where} holds at least {n:,} entries, more than {top:,}", "width")


def structure(data: bytes) -> tuple[int, int]:
    """``(deepest nesting, values)`` of ``data`` counted outside strings: ``[``/``{`` open a level, and every
    opening and comma starts a value (the whole document; bounded memory)."""
    scan = _scan(data, 1 << 62, 1 << 62, 1 << 62)
    return scan.deepest, scan.values


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in ``data`` outside strings."""
    return structure(data)[0]


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonRefused(f"a number of {digits} digits (integers of at most {MAX_INT_DIGITS} are accepted)", "digits")
    return int(text)


def check_structure(data: bytes, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> None:
    """Raise :class:`JsonRefused` at the first piece of ``data`` that nests deeper than ``max_depth``, holds over
    ``max_values`` values or a run of over :data:`MAX_NUMBER_DIGITS` digits."""
    if len(data) <= min(MAX_NUMBER_DIGITS, max_values) and data.count(b"[") + data.count(b"{") <= max_depth:
        return  # too short to cross any limit: a dataset line of a million small documents skips the numpy scan
    _raise_over(_scan(data, max_depth, max_values, MAX_NUMBER_DIGITS), max_depth, max_values)


def _raise_over(scan: _Scan, max_depth: int, max_values: int) -> None:
    if scan.deepest > max_depth:
        raise JsonRefused(
            f"nested at least {scan.deepest} levels deep, more than the {max_depth} a JSON document may nest", "depth"
        )
    if scan.values > max_values:
        raise JsonRefused(
            f"at least {scan.values:,} values, more than the {max_values:,} a JSON document may hold", "values"
        )
    if scan.longest_digits > MAX_NUMBER_DIGITS:
        raise JsonRefused(
            f"a number of at least {scan.longest_digits:,} digits, more than the {MAX_NUMBER_DIGITS:,} a JSON "
            "number may have",
            "digits",
        )


def loads(data: bytes | str, *, max_values: int = MAX_VALUES, **hooks: Any) -> Any:
    """Parse one JSON document after the structure check (at most ``max_values`` values); ``hooks`` go to
    ``json.loads`` (``object_pairs_hook``, ...).

    Raises :class:`JsonRefused`, ``json.JSONDecodeError`` or ``UnicodeDecodeError``: all ``ValueError``.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    check_structure(raw, max_values=max_values)
    text = data if isinstance(data, str) else raw.decode("utf-8")
    hooks.setdefault("parse_int", _bounded_int)
    try:
        return json.loads(text, **hooks)
    except RecursionError:  # not reached below MAX_DEPTH; kept so no input can end in a traceback
        raise JsonRefused(f"nested more deeply than Python's decoder can follow (limit {MAX_DEPTH})", "depth") from None
