"""Request bodies of the completion endpoints: JSON, the schema and the prompt's bounds (001 §9.2, issue 49).

Everything here runs in a worker thread (:mod:`calctl.serving.api.workers`) and
takes time in proportion to the body, so it is also written to hold the
interpreter lock as little as the work allows:

* JSON by orjson (a quarter of the standard library's time), the standard
  library only for what orjson refuses (UTF-16, a BOM, NaN);
* a completions body whose prompt is a JSON array of more token ids than the
  model's context has tokens is refused from a scan of its bytes
  (:func:`refuse_long_ids`: numpy, which gives up the lock, counts and checks
  the array; no JSON parser builds a million ints, which took 15-20 ms of the
  lock per 4 MiB body); a chat with more messages than that is refused on its
  length, before the schema validates them; chat messages are validated one by
  one, so the lock can go to the event loop between two;
* a text prompt is refused from its token count (:meth:`TextCodec.encode_within`)
  when it leaves no room for one output token: its ids are never built.

A refusal is :class:`Refused`: the 400 response, and the alias and prompt size
the request's 001 §14 record names. No engine, no HTTP routing here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from fastapi.responses import Response
from pydantic import ValidationError

from calctl.serving.api.errors import invalid
from calctl.serving.api.schemas import ChatMessage
from calctl.serving.api.workers import BIG_BODY, BIG_INPUT, give_back_memory
from calctl.serving.protocol import EngineRejection
from calctl.serving.text import TextCodec

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; the standard library does the same, slower
    orjson = None  # type: ignore[assignment]

T = TypeVar("T")
#: A prompt of this many token ids or messages for a model the server does not have is its 404 before the schema.
HEAVY_ENTRIES = 1024
#: Where :func:`refuse_long_ids` looks for the ``"prompt"`` key (clients put it near the start), and how many
#: occurrences it tries: a body that hides it further in is parsed as any other.
_KEY_WITHIN = 64 * 1024
_KEY_TRIES = 8
#: The bytes :func:`_count_ids` checks per numpy step (fits a core's L2 cache; no temporary past it).
SCAN_BLOCK = 64 * 1024
_PROMPT_ARRAY = re.compile(rb'"prompt"[ \t\r\n]{0,64}:[ \t\r\n]{0,64}\[')
_NOT_JSON = object()
_SURROGATE = object()


class Refused(Exception):
    """A 400 the HTTP layer decided. ``alias``: the served model the body named (None: none, or not a string);
    ``prompt_tokens``: the prompt's size when it was counted."""

    def __init__(self, response: Response, alias: str | None = None, prompt_tokens: int | None = None) -> None:
        super().__init__(response.status_code)
        self.response, self.alias, self.prompt_tokens = response, alias, prompt_tokens


def parse_body(raw: bytes, model: type[T], context_of: Callable[[object], int | None]) -> T:
    """The body as ``model``; Refused with its 400, or EngineRejection (404) for a heavy body naming a model
    the engine does not serve. ``context_of``: a served alias's context limit (None for no string)."""
    doc = _json(raw)
    if doc is _NOT_JSON:
        raise Refused(invalid("request body is not valid JSON", code="invalid_json"))
    if doc is _SURROGATE:
        message = (
            "request body is not valid JSON text: a string holds a lone UTF-16 surrogate escape (\\ud800 to "
            "\\udfff), which is no character; send the character itself, or both halves of its surrogate pair"
        )
        raise Refused(invalid(message, code="invalid_json"))
    if not isinstance(doc, dict):
        raise Refused(invalid("request body must be a JSON object", code="invalid_json"))
    alias = doc.get("model") if isinstance(doc.get("model"), str) else None
    _refuse_too_many(doc, alias, context_of)
    try:
        if isinstance(doc.get("messages"), list):
            doc = {**doc, "messages": _messages(doc["messages"])}
        body = model.model_validate(doc)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise Refused(_invalid_field(exc), alias) from None
    except _BadMessage as bad:
        raise Refused(_invalid_field(bad.error, ("messages", bad.index)), alias) from None
    unsupported = body.unsupported()
    if unsupported:
        raise Refused(invalid(unsupported[1], param=unsupported[0], code="unsupported_parameter"), alias)
    return body


def refuse_long_ids(raw: bytes, context_of: Callable[[object], int | None]) -> None:
    """Refused (or EngineRejection, 404) for a completions body whose top-level ``prompt`` is a JSON array of at
    least as many token ids as the model's context has tokens, decided without parsing the array: a prompt that
    long can never be served (000 §5.1: never accept a request bound to exceed the context; §5.2: RejectInvalid,
    400, the prompt past the context).
    Returns for anything else, which :func:`parse_body` then reads in full.

    The array is found by its key, checked by :func:`_count_ids` (numpy: the interpreter lock is free while it
    runs), and the rest of the body parsed with the array replaced by ``[]``: the key was the document's own
    ``prompt`` only if that parse has ``"prompt": []`` (a nested or duplicated key does not; a body whose own
    prompt is ``[]`` is refused either way). Same order as the full path: the model's 404 before the count."""
    found = _ids_array(raw)
    if found is None:
        return
    start, end, count = found
    if count < HEAVY_ENTRIES or len(raw) - (end - start) >= BIG_BODY:
        return  # few ids (their parse is cheap), or more besides them than is cheap to parse twice
    doc = _json(raw[:start] + b"[]" + raw[end:])
    if not isinstance(doc, dict) or doc.get("prompt") != []:
        return
    alias = doc.get("model") if isinstance(doc.get("model"), str) else None
    limit = context_of(doc.get("model"))  # EngineRejection: the 404, count >= HEAVY_ENTRIES
    if limit is not None and alias is not None and count >= limit:
        raise too_long(count, limit, alias, "prompt")


def ids_prompt(head: bytes) -> bool:
    """Whether a body's first bytes put a JSON array after a ``"prompt"`` key (a prompt of token ids): the guard
    joins such a large body off the event loop. A guess from the head only; the route decides from the whole."""
    return _PROMPT_ARRAY.search(head, 0, _KEY_WITHIN) is not None


def _ids_array(raw: bytes) -> tuple[int, int, int] | None:
    """(start, end, entries) of the array after the first ``"prompt":`` key near the body's start that holds
    only non-negative decimal integers, or None. One ``find`` of a closing bracket and numpy: no Python loop
    over the body."""
    pos = 0
    for _ in range(_KEY_TRIES):
        at = raw.find(b'"prompt"', pos, _KEY_WITHIN)
        if at < 0:
            return None
        key = _PROMPT_ARRAY.match(raw, at)
        if key is not None:
            start = key.end() - 1
            end = raw.find(b"]", start)
            count = None if end < 0 else _count_ids(raw, start + 1, end)
            return None if count is None else (start, end + 1, count)
        pos = at + 1
    return None


def _count_ids(raw: bytes, lo: int, hi: int) -> int | None:
    """How many integers ``raw[lo:hi]`` lists when it is exactly the inside of a JSON array of non-negative
    integers (``1,2, 3``, JSON whitespace after a comma or around the list), else None.

    Grammar checked byte-wise: only digits, commas and whitespace; the first and last non-blank bytes digits;
    whitespace never right after a digit (``1 2``; ``1 ,2`` is valid JSON, left to the parser) and a comma only
    right after one (``1,,2``, ``1, ,2``); no number with a leading zero (``01``). Each step is a numpy operation,
    which runs without the interpreter lock, over one block of :data:`SCAN_BLOCK` bytes at a time (two passes
    over the blocks: the classes and counts, then the pairs): the temporaries stay small and reused, never
    megabytes of freshly mapped memory, and the lock changes hands between two blocks."""
    n = hi - lo
    if n <= 0:
        return None
    a = np.frombuffer(raw, np.uint8, n, lo)
    counted = _classes(a)
    if counted is None:
        return None
    commas, first, last = counted
    for s in range(first, last + 1, SCAN_BLOCK):
        # Each block with one byte of its neighbours on either side (within the numbers' span), so that every
        # pair of adjacent bytes and every byte's neighbours are seen together in some block.
        at = max(first, s - 1)
        if not _pairs_ok(a[at : min(last + 1, s + SCAN_BLOCK + 1)], number_start=at == first):
            return None
    return commas + 1


def _classes(a: np.ndarray[Any, np.dtype[np.uint8]]) -> tuple[int, int, int] | None:
    """(commas, first digit, last digit) when ``a`` holds only digits, commas and JSON whitespace, at least one
    digit, and no comma before the first digit or after the last; else None."""
    commas = 0
    first = last = -1
    trailing = False
    for s in range(0, len(a), SCAN_BLOCK):
        w = a[s : s + SCAN_BLOCK]
        digit = np.less(w - np.uint8(48), 10)
        comma = w == 44
        digits, block_commas = int(np.count_nonzero(digit)), int(np.count_nonzero(comma))
        blanks = int(np.count_nonzero(w == 32))
        if digits + block_commas + blanks != len(w):  # tabs and line breaks (pretty-printed), or another byte
            blanks += sum(int(np.count_nonzero(w == c)) for c in b"\t\n\r")
            if digits + block_commas + blanks != len(w):
                return None
        if digits:
            if first < 0:
                if comma[: int(np.argmax(digit))].any():
                    return None  # a comma before the first number
                first = s + int(np.argmax(digit))
            last = s + len(w) - 1 - int(np.argmax(digit[::-1]))
            after = comma[last - s + 1 :]  # commas after this block's last digit: a later digit must follow
            trailing = bool(after.any())
        elif first < 0:
            if block_commas:
                return None
        else:
            trailing = trailing or bool(block_commas)
        commas += block_commas
    if first < 0 or trailing:
        return None  # no number, or a comma after the last
    return commas, first, last


def _pairs_ok(w: np.ndarray[Any, np.dtype[np.uint8]], *, number_start: bool) -> bool:
    """Adjacent bytes of ``w`` (inside the numbers' span) follow the grammar: after a digit a digit or a comma,
    after a comma or a blank a digit or a blank; no number starts with 0 and goes on. ``number_start``: ``w[0]``
    begins a number (the span's first digit); otherwise ``w[0]`` is only the previous block's last byte, whose
    own checks that block made."""
    digit = np.less(w - np.uint8(48), 10)
    comma = w == 44
    other = ~digit  # a comma or a blank
    if np.any(other[1:] & (comma[1:] ^ digit[:-1])):
        return False
    leading_zero = w == 48
    leading_zero[1:] &= other[:-1]  # a number's first digit is 0 ...
    leading_zero[0] &= number_start
    return not np.any(leading_zero[:-1] & digit[1:])  # ... and another digit follows it


def encode_prompt(codec: TextCodec, text: str, limit: int, alias: str, param: str) -> list[int]:
    """The prompt's ids; Refused when it leaves no room in the context ``limit`` for one output token."""
    ids, count = codec.encode_within(text, limit - 1)
    if len(text) >= BIG_INPUT:
        give_back_memory()
    if ids is None:
        raise too_long(count, limit, alias, param)
    return ids


def too_long(count: int, limit: int, alias: str, param: str) -> Refused:
    """The scheduler's own words for the prompt that fills the context (core admission decides every other
    case); said here so that the ids of a prompt that can never be served are not built, copied or checked."""
    message = f"{alias}: prompt has {count} tokens; with at least 1 output token it exceeds context limit {limit}"
    return Refused(invalid(message, param=param), alias, count)


def _refuse_too_many(doc: dict[str, Any], alias: str | None, context_of: Callable[[object], int | None]) -> None:
    """Refused for a prompt of token ids or a chat with more entries than the model's context has tokens,
    before the schema runs: validating a million ids or a hundred thousand messages holds the interpreter lock
    (and stalls the event loop) for seconds, only to refuse them. Every message of a chat takes at least one
    token of the template's; a small body for a model the engine does not serve keeps its field errors first."""
    ids, messages = doc.get("prompt"), doc.get("messages")
    id_count = len(ids) if isinstance(ids, list) and ids and type(ids[0]) is int else 0
    message_count = len(messages) if isinstance(messages, list) else 0
    if not (id_count or message_count):
        return
    try:
        limit = context_of(doc.get("model"))
    except EngineRejection:
        if max(id_count, message_count) >= HEAVY_ENTRIES:
            raise  # the 404 now, not after seconds of validating entries that no model will read
        return
    if limit is None or alias is None:
        return
    if id_count >= limit:
        raise too_long(id_count, limit, alias, "prompt")
    if message_count >= limit:
        message = f"{alias}: {message_count} messages cannot fit context limit {limit} (each takes at least one token)"
        raise Refused(invalid(message, param="messages"), alias)


class _BadMessage(Exception):
    def __init__(self, index: int, error: ValidationError) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


def _messages(items: list[Any]) -> list[Any]:
    """Each chat message validated on its own: between two the interpreter lock can go to the event loop,
    where one call over thousands of them holds it throughout. Raises _BadMessage for the first bad one."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(ChatMessage.model_validate(item))
        except ValidationError as exc:
            raise _BadMessage(i, exc) from None
    return out


def _invalid_field(exc: ValidationError, at: tuple[str | int, ...] = ()) -> Response:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in (*at, *first.get("loc", ())))
    return invalid(f"{loc or 'body'}: {first.get('msg')}", param=loc or None)


def _json(raw: bytes) -> Any:
    """The body's JSON document, or :data:`_NOT_JSON` when it is not JSON that can be text.

    orjson refuses a lone UTF-16 surrogate itself; what it refuses goes to the standard library, which also
    reads a UTF-16 or BOM-prefixed body (and NaN, which the schema then refuses by name)."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError too
        # Python's json also fails with ValueError (an integer past its digit limit) or RecursionError (deep
        # nesting), not only JSONDecodeError; all are a 400, not a 500.
        return _NOT_JSON
    try:
        # A lone UTF-16 surrogate ("\ud800") parses into a str that is no text: UTF-8 and the tokenizer
        # refuse it, so the whole body is, with a message that says why.
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return _SURROGATE
    return doc


__all__ = ["HEAVY_ENTRIES", "Refused", "encode_prompt", "ids_prompt", "parse_body", "refuse_long_ids", "too_long"]
