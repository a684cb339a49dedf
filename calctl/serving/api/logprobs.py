"""Log-probabilities in the two shapes OpenAI returns them, from the engine's :class:`TokenLogprob` values.

* chat completions: ``choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token,
  logprob, bytes}]}], "refusal": null}``, ``top_logprobs`` holding exactly the ``top_logprobs`` most likely;
* legacy completions: ``choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}``, each
  ``top_logprobs`` entry a ``{token text: logprob}`` map of the ``logprobs`` most likely plus the sampled
  token (OpenAI: "up to logprobs+1 elements"); ``text_offset`` is the character offset in the generated text
  where each token starts (a token that ends a character split across tokens starts after the characters
  complete before it), continued across a stream's chunks.

A token's text is its bytes when they are whole UTF-8 characters, and OpenAI's ``bytes:\\xe4\\xbd`` form
when they are part of a character split across tokens (so two such tokens never share a string, and the
legacy maps keep both); ``bytes`` are the exact bytes, so a client can join them. The EOS token that ends
an output is not listed, as it is not text and not counted in ``usage.completion_tokens``
(``calctl.serving.api.deltas``).

Formatting only: no engine, no HTTP.
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from calctl.serving.protocol import TokenLogprob
from calctl.serving.text import TextCodec

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a SentencePiece byte-fallback token
FLOOR = -9999.0  # vLLM's floor: a token the model gives no probability (-inf, or NaN from a broken row) is JSON


def _finite(logprob: float) -> float:
    return logprob if logprob >= FLOOR else FLOOR  # NaN compares false: floored too


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the inverse of ``bytes_to_unicode``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenNames:
    """Each token id's bytes and text under one codec (cached for the response being built)."""

    def __init__(self, codec: TextCodec) -> None:
        tok = codec.tokenizer
        self._tok = tok
        self._byte_level = type(tok.decoder).__name__ == "ByteLevel"
        added = tok.get_added_tokens_decoder()
        self._added = set(added)
        self.special = frozenset(i for i, t in added.items() if t.special)  # not in the text (skipped on decode)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def _bytes(self, token_id: int) -> bytes:
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self._added:
            return piece.encode("utf-8")
        table = _byte_decoder()
        if self._byte_level and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")  # SentencePiece's word boundary is a space

    def of(self, token_id: int) -> tuple[str, bytes]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token_id] = (text, raw)
        return hit


def chat_logprobs(entries: Sequence[TokenLogprob], names: TokenNames) -> dict[str, Any]:
    """The chat completions ``logprobs`` object of ``entries``."""

    def one(token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = names.of(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(raw)}

    content = [{**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


@dataclass
class CompletionLogprobs:
    """The legacy ``logprobs`` objects of one response, chunk by chunk: ``text_offset`` carries on."""

    names: TokenNames
    done: int = 0  # characters of the text decoded for good so far (the decoder may hold up to 3 more bytes)
    _utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    def _offset_of(self, token_id: int, raw: bytes) -> int:
        """Where the token starts in the text: the characters of everything before it, where bytes it turns
        into U+FFFD (an unfinished character it does not continue) count before it, and bytes it completes
        into a character do not."""
        held = self._utf8.getstate()[0]
        if token_id in self.names.special:  # the text skips special tokens (TextCodec.decode)
            return self.done + len(held.decode("utf-8", "replace"))
        offset = self.done + len((held + raw).decode("utf-8", "replace")) - len(raw.decode("utf-8", "replace"))
        self.done += len(self._utf8.decode(raw))
        return offset

    def of(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        tokens, token_logprobs, top, offsets = [], [], [], []
        for e in entries:
            text, raw = self.names.of(e.token_id)
            alternatives = {self.names.of(i)[0]: _finite(lp) for i, lp in e.top}
            alternatives.setdefault(text, _finite(e.logprob))  # the sampled token is always there
            tokens.append(text)
            token_logprobs.append(_finite(e.logprob))
            top.append(alternatives)
            offsets.append(self._offset_of(e.token_id, raw))
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


class LogprobShape:
    """One response's ``logprobs`` objects in its endpoint's shape, chunk after chunk."""

    def __init__(self, chat: bool, names: TokenNames) -> None:
        self._chat = chat
        self._names = names
        self._legacy = CompletionLogprobs(names)

    def of(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        return chat_logprobs(entries, self._names) if self._chat else self._legacy.of(entries)


__all__ = ["CompletionLogprobs", "LogprobShape", "TokenNames", "chat_logprobs"]
