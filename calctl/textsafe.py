"""Terminal-safe text: the one way a string from a package (or any input) reaches a person's terminal.

A package is written by whoever built it. Its names, versions, file names and
the messages that quote them must never act on the operator's terminal:

* control characters (C0, DEL, C1: ``ESC[2K`` erases a line, OSC 52 writes the
  clipboard, a bare ``\\r`` overwrites what was printed) and the characters that
  reorder or hide text (bidirectional overrides and isolates, zero-width marks,
  U+2028/U+2029 line separators) are shown escaped, ``\\x1b``, ``\\u202e``;
* lone surrogates (which no terminal encoding can carry, so printing one raised
  ``UnicodeEncodeError``) are shown escaped, ``\\ud800``; an undecodable file-name
  byte (os's surrogateescape, U+DC80..U+DCFF) is shown as that byte, ``\\xff``;
* rich markup is escaped (:func:`markup`): ``[/x]`` is text, not a closing tag
  (an unmatched one raised ``MarkupError``), and ``[link=…]`` makes no hyperlink;
* a quoted value longer than :data:`MAX_QUOTED` characters (``'vvvv…'``: a 60 KB
  version was quoted whole in MAN001) is shortened to its head and tail with an
  ellipsis and its length, ``'vvv…vvv' (60000 characters)`` (:func:`shorten`).

:func:`plain` is for text that is printed as it is (a ``rich.text.Text``, a log
file); :func:`markup` for text placed inside a rich markup string. Nothing here
imports rich until :func:`markup` is called, so any layer may use it.
"""

from __future__ import annotations

import math
import re
import unicodedata

# C0 controls but TAB and LF, DEL, C1 controls; ALM, LRM/RLM, zero-width joiners and marks, line/paragraph
# separators, bidi embeddings/overrides/isolates, BOM; every surrogate (a str holding one cannot be encoded).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
)
_UNSAFE_WITH_LINES = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
)


#: The longest quoted value a message shows whole; a longer one keeps its first and last characters.
MAX_QUOTED = 256
_HEAD, _TAIL = 120, 40
# A Python-repr-style literal: it opens at the start or after a space or bracket (not after a letter, so prose's
# "package's ... don't" is no literal) and closes before the end, a space, a bracket or punctuation.
_LONG = f"{{{MAX_QUOTED + 1},}}"
_QUOTED = re.compile(
    r"(?:(?<=^)|(?<=[\s(\[{,:=]))" + f"(?:'[^'\\n]{_LONG}'|\"[^\"\\n]{_LONG}\")" + r"(?=$|[\s)\]},:;.])"
)
#: The longest text :func:`clip` leaves whole (a file name or field shown in a table).
MAX_TEXT = 1024


def _shorten_literal(match: re.Match[str]) -> str:
    literal = match.group(0)
    quote, inner = literal[0], literal[1:-1]
    try:
        import ast

        length = len(ast.literal_eval(literal))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        length = len(inner)
    return f"{quote}{inner[:_HEAD]}…{inner[-_TAIL:]}{quote} ({length} characters)"


def shorten(text: str) -> str:
    """``text`` with every quoted value over :data:`MAX_QUOTED` characters shortened (head…tail, and its length)."""
    if len(text) <= MAX_QUOTED:
        return text
    return _QUOTED.sub(_shorten_literal, text)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` itself when at most ``limit`` characters, else its head and tail with an ellipsis and its length."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 80]}…{text[-40:]} ({len(text)} characters)"


def _escape_char(match: re.Match[str]) -> str:
    c = ord(match.group(0))
    if 0xDC80 <= c <= 0xDCFF:  # an undecodable byte of a file name (surrogateescape): show the byte
        return f"\\x{c - 0xDC00:02x}"
    if c <= 0xFF:
        return f"\\x{c:02x}"
    return f"\\u{c:04x}"


def plain(text: object, *, multiline: bool = False) -> str:
    """``text`` with every unsafe character shown as an escape (``\\x1b``, ``\\ud800``), and long quoted values
    shortened (:func:`shorten`); nothing else changes.

    Newlines and tabs are escaped too unless ``multiline`` (a name is one line: a newline in it could forge a
    line of output); the result always encodes as UTF-8.
    """
    s = "" if text is None else str(text)
    pattern = _UNSAFE if multiline else _UNSAFE_WITH_LINES
    return shorten(pattern.sub(_escape_char, s))


def markup(text: object, *, multiline: bool = False) -> str:
    """:func:`plain`, then rich markup escaped: safe to put inside a rich markup string."""
    from rich.markup import escape

    return escape(plain(text, multiline=multiline))


def is_safe(text: str, *, multiline: bool = False) -> bool:
    """Whether ``text`` holds no character :func:`plain` would escape."""
    return (_UNSAFE if multiline else _UNSAFE_WITH_LINES).search(text) is None


__all__ = ["MAX_QUOTED", "clip", "is_safe", "markup", "plain", "shorten"]


_DECIMAL_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def decimal_int(text: str) -> int:
    """``text`` (surrounding spaces aside) as an integer of ASCII decimal digits with an optional sign.

    Python's ``int()`` also takes ``1_000``, non-ASCII digits (``'٣'``) and, with spaces, more: a number that is not
    what it looks like is a ``ValueError`` here."""
    s = text.strip()
    if not s.isascii() or _DECIMAL_INT.fullmatch(s) is None:
        raise ValueError(f"{text!r} is not a decimal integer")
    return int(s)


def decimal_float(text: str) -> float:
    """``text`` as a finite ASCII decimal number (``1``, ``0.5``, ``2e-3``; ``-0`` is 0): not ``inf``, ``nan``,
    ``1e309`` (infinite), ``1_0`` or non-ASCII digits, which ``float()`` takes (a ``ValueError`` here)."""
    s = text.strip()
    if not s.isascii() or _DECIMAL_FLOAT.fullmatch(s) is None:
        raise ValueError(f"{text!r} is not a decimal number")
    value = float(s) + 0.0
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not finite")
    return value


def caseless(name: str) -> str:
    """The name a case- and normalisation-insensitive file system sees: Unicode's canonical caseless form
    (NFD, case fold, then NFC), so 'Café.npy' (NFC) and 'cafe\u0301.npy' (NFD) are one name (issue 54)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", name).casefold())
