"""Text in and out of a model: tokenizer, chat template, incremental detokenizing, stop strings.

One :class:`TextCodec` per alias, built from the package's own ``tokenizer.json``
and ``tokenizer_config.json`` (001 §8.3: each model keeps its own tokenizer, so
an alias can never be served with another model's vocabulary). Chat templates
render in Jinja2's immutable sandbox, as Hugging Face does.

This module knows nothing about HTTP, scheduling or devices.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from calctl.errors import ConfigError


class ChatTemplateError(ValueError):
    """The request's messages cannot be rendered by the model's chat template."""


@dataclass
class TextCodec:
    tokenizer: Tokenizer
    chat_template: str | None
    eos_token_id: int | None
    special_ids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_files(cls, tokenizer_json: Path, config_json: Path | None, eos_token_id: int | None) -> TextCodec:
        try:
            tok = Tokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise ConfigError(f"{tokenizer_json}: cannot load tokenizer: {exc}") from None
        template = None
        if config_json is not None and config_json.is_file():
            try:
                cfg = json.loads(config_json.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{config_json}: cannot read tokenizer config: {exc}") from None
            template = cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
            if eos_token_id is None and isinstance(cfg.get("eos_token"), str):
                eos_token_id = tok.token_to_id(cfg["eos_token"])
        specials = frozenset(
            i for t, i in tok.get_vocab(with_added_tokens=True).items() if t.startswith("<|") and t.endswith("|>")
        )
        return cls(tokenizer=tok, chat_template=template, eos_token_id=eos_token_id, special_ids=specials)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None


class IncrementalDetokenizer:
    """Turn a growing list of token ids into text deltas.

    Byte-level BPE tokens can split a UTF-8 character; a delta is held back while
    the decoded text ends in U+FFFD so a client never sees half a character.
    """

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []
        self._emitted = ""

    @property
    def text(self) -> str:
        return self._emitted

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        full = self._codec.decode(self._ids)
        if full.endswith("\ufffd"):
            return ""
        delta = full[len(self._emitted) :] if full.startswith(self._emitted) else ""
        self._emitted = full if full.startswith(self._emitted) else self._emitted
        return delta

    def flush(self) -> str:
        full = self._codec.decode(self._ids)
        if full.startswith(self._emitted) and len(full) > len(self._emitted):
            delta = full[len(self._emitted) :]
            self._emitted = full
            return delta
        return ""


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
