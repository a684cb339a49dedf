"""Text in and out of a model: tokenizer, chat template, incremental detokenizing, stop strings.

One :class:`TextCodec` per alias, built from the package's own ``tokenizer.json``
and ``tokenizer_config.json`` (001 §8.3: each model keeps its own tokenizer, so
an alias can never be served with another model's vocabulary). The chat template
is compiled once per codec and renders in Jinja2's immutable sandbox with the
variables Hugging Face templates expect (``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``raise_exception``), within the cost bounds of
:mod:`calctl.package.chat_template` (a request whose messages cross one is a 400).

:class:`IncrementalDetokenizer` turns streamed token ids into text deltas that
are always whole characters: a byte-level BPE token can end in the middle of a
UTF-8 sequence, and that partial character is held until the token that
completes it arrives (the offsets technique of Hugging Face's ``TextStreamer``
and vLLM's detokenizer, so each step decodes a short window, not the whole
output). :class:`StopMatcher` finds stop strings across delta boundaries.

This module knows nothing about HTTP, scheduling or devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from tokenizers import Tokenizer

from calctl import jsonsafe
from calctl.errors import ConfigError
from calctl.package import tokenizer_file
from calctl.package.chat_template import BoundedTemplate, TemplateTooCostly


class ChatTemplateError(ValueError):
    """The request's messages cannot be rendered by the model's chat template."""


@dataclass
class TextCodec:
    tokenizer: Tokenizer
    chat_template: str | None
    eos_token_id: int | None
    special_ids: frozenset[int] = field(default_factory=frozenset)
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token / eos_token text, for templates

    def __post_init__(self) -> None:
        self._template: BoundedTemplate | None = None
        if self.chat_template:
            try:  # compiled once in the bounded sandbox validate's TOK005 probes; rendered per request within it
                self._template = BoundedTemplate(
                    self.chat_template, keep_trailing_newline=False, raise_exception=_raise_exception
                )
            except TemplateError as exc:
                raise ConfigError(f"chat template does not compile: {exc}") from None

    @classmethod
    def from_files(cls, tokenizer_json: Path, config_json: Path | None, eos_token_id: int | None) -> TextCodec:
        try:  # bounded read and scan first (validate's TOK001 check; the package may have changed since)
            data = tokenizer_file.read(tokenizer_json)
        except (OSError, tokenizer_file.TokenizerRefused) as exc:
            raise ConfigError(f"{tokenizer_json}: cannot load tokenizer: {exc}") from None
        try:
            tok = Tokenizer.from_buffer(data)  # any path bytes: from_file takes UTF-8 only
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise ConfigError(f"{tokenizer_json}: cannot load tokenizer: {exc}") from None
        template = None
        names: dict[str, str] = {}
        if config_json is not None and config_json.is_file():
            try:
                cfg = jsonsafe.loads(config_json.read_bytes())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{config_json}: cannot read tokenizer config: {exc}") from None
            if not isinstance(cfg, dict):
                raise ConfigError(f"{config_json}: tokenizer config is a JSON {type(cfg).__name__}, expected an object")
            template = cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
            for key in ("bos_token", "eos_token"):
                value = cfg.get(key)
                if isinstance(value, dict):  # the AddedToken form: {"content": "<s>", ...}
                    value = value.get("content")
                if isinstance(value, str):
                    names[key] = value
            if eos_token_id is None and "eos_token" in names:
                eos_token_id = tok.token_to_id(names["eos_token"])
        if eos_token_id is not None and "eos_token" not in names:
            eos_text = tok.id_to_token(eos_token_id)
            if eos_text is not None:
                names["eos_token"] = eos_text
        specials = frozenset(
            i for t, i in tok.get_vocab(with_added_tokens=True).items() if t.startswith("<|") and t.endswith("|>")
        )
        try:
            return cls(
                tokenizer=tok,
                chat_template=template,
                eos_token_id=eos_token_id,
                special_ids=specials,
                special_tokens=names,
            )
        except ConfigError as exc:
            raise ConfigError(f"{config_json}: {exc}") from None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._encoding(text).ids

    def _encoding(self, text: str) -> Any:
        # encode_batch_fast, not encode: the tokenizers binding runs a batch with the interpreter lock released
        # and a single encode with it held, so a megabyte prompt tokenized in a worker thread would still stall
        # the event loop (and the other model's streams) for seconds (issue 49; 001 §9.2). The fast batch keeps
        # no character offsets, which nothing here reads: building them held the lock 0.4 s and freeing them
        # 0.6 s for a 4 MiB prompt (measured beside a 2 ms timer thread); without them, 30 ms. Same ids.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0]

    def encode_within(self, text: str, limit: int) -> tuple[list[int] | None, int]:
        """(ids, how many): ids None when there are more than ``limit``. The ids of a prompt too long to serve
        are never built: a list of two million ints holds the interpreter lock ~0.1 s, the event loop's too."""
        encoding = self._encoding(text)
        count = len(encoding)
        return (encoding.ids if count <= limit else None), count

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The model's own chat template over ``messages`` (the template compiled once, at load)."""
        if self._template is None or not self.chat_template:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.special_tokens.get("bos_token", ""),
                eos_token=self.special_tokens.get("eos_token", ""),
            )
        except TemplateTooCostly as exc:  # costly for these messages only (validate probed a short chat): a 400
            raise ChatTemplateError(f"chat template is too costly to render these messages: {exc}") from None
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None


def _raise_exception(message: str) -> None:
    """``raise_exception(...)`` in a Hugging Face chat template: the messages break the template's rules."""
    raise ChatTemplateError(f"chat template refused the messages: {message}")


#: Tokens of context kept before the text being streamed: enough for a decoder that treats the first token of
#: a decode specially (SentencePiece/Metaspace drops a leading space) and for the longest UTF-8 character.
CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """Turn a growing list of token ids into text deltas that are always whole characters.

    Each push decodes only a window: ``ids[prefix:]`` against ``ids[prefix:read]``
    (the text already sent). When the window's text ends in U+FFFD, the last
    token split a UTF-8 character and nothing is sent until a later token
    completes it. ``context``: the last prompt token ids, so the first output
    token decodes as it does in the middle of the text.
    """

    def __init__(self, codec: TextCodec, context: Sequence[int] = ()) -> None:
        self._codec = codec
        ctx = list(context)[-CONTEXT_TOKENS:]
        self._ids: list[int] = ctx
        self._prefix = 0
        self._read = len(ctx)
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """Everything sent so far."""
        return "".join(self._parts)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the output: whatever is held, less a character the model never completed.

        Output cut by ``max_tokens`` (or a stop) in the middle of a multi-byte character would decode its
        first bytes as U+FFFD; that is not text the model wrote, so it is dropped, as llama.cpp's server does.
        """
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        ids, decode = self._ids, self._codec.decode
        sent = decode(ids[self._prefix : self._read])
        window = decode(ids[self._prefix :])
        if final and window.endswith("\ufffd") and not sent.endswith("\ufffd"):
            window = window.rstrip("\ufffd")  # the bytes of a character that never arrived
        if len(window) <= len(sent) or (window.endswith("\ufffd") and not final):
            return ""  # nothing new yet, or a character split across tokens: wait for the rest of it
        delta = window[len(sent) :]
        # The tokens just sent become the next window's context (vLLM's prefix/read offsets).
        self._prefix, self._read = self._read, len(ids)
        self._parts.append(delta)
        return delta


class OutputText:
    """The text a client is sent for a model's output tokens: whole characters, the EOS token dropped, cut
    before the first stop string (:class:`IncrementalDetokenizer` + :class:`StopMatcher`).

    The API's text deltas (:mod:`calctl.serving.api.deltas`) and the engine's 001 §14 record of a request
    that ended at ``max_tokens`` (:func:`stopped_by_text`) both use it, so the finish reason a client sees
    and the one the record and ``calctl_requests_total`` show cannot disagree."""

    def __init__(self, codec: TextCodec, stops: Sequence[str], context: Sequence[int] = ()) -> None:
        self._detok = IncrementalDetokenizer(codec, context=context)
        self._matcher = StopMatcher(stops)
        self._eos = codec.eos_token_id

    def push(self, token_id: int) -> tuple[str, bool]:
        """(text safe to send now, a stop string was found); the EOS token is no text."""
        if token_id == self._eos:
            return "", False
        return self._matcher.feed(self._detok.push(token_id))

    def end(self) -> tuple[str, bool]:
        """At the end of the output: (what was held back, a stop string was found in it)."""
        safe, stopped = self._matcher.feed(self._detok.flush())
        return safe + ("" if stopped else self._matcher.flush()), stopped


def stopped_by_text(codec: TextCodec, stops: Sequence[str], context: Sequence[int], tokens: Sequence[int]) -> bool:
    """Whether the text of ``tokens`` (after ``context``, the prompt) contains one of ``stops``: the client
    was told ``stop``. The engine calls it (on its own thread) only for a request with stop strings that it
    ended for its length.

    One decode of the whole output first (0.2 ms for 2,000 tokens): when no stop string is in that text the
    answer is no. Only when one is does the token-by-token replay of what the client was sent decide (30 ms for
    2,000 tokens on a loaded host), so the common case never costs the engine thread a replay."""
    wanted = [s for s in stops if s]
    if not wanted:
        return False
    ctx = list(context)[-CONTEXT_TOKENS:]
    out = [t for t in tokens if t != codec.eos_token_id]
    whole = codec.decode([*ctx, *out])
    # ``whole`` has the prompt's context too: only ever a false alarm, which the replay settles.
    if not any(s in whole for s in wanted):
        return False
    text = OutputText(codec, wanted, context)
    return any(text.push(t)[1] for t in tokens) or text.end()[1]


class StopMatcher:
    """Find OpenAI ``stop`` strings in streamed text, holding back possible prefixes.

    ``feed`` returns ``(safe_text, stopped)``: text that can be sent now and
    whether a stop string was found (the stop string itself is never sent).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""
        self._hold = max((len(s) for s in self._stops), default=1) - 1

    def feed(self, delta: str) -> tuple[str, bool]:
        if not self._stops:
            return delta, False
        buf = self._pending + delta
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._pending = ""
            return buf[:cut], True
        # Keep back the longest suffix that is a prefix of some stop string.
        keep = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
