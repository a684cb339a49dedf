"""OpenAI request bodies, validated with pydantic before anything reaches the engine.

Every parameter OpenAI or vLLM defines for these endpoints is honoured or, set to
anything but its "asks for nothing" value, a 400 naming it (:data:`REFUSED`; the
table in docs/serve.md). A field neither defines is accepted and ignored, as vLLM
does (clients send vendor extensions). The sampling parameters are range-checked
here with messages naming the range; ``logit_bias`` ids are checked against the
alias's vocabulary where the codec is known (``calctl.serving.api.sampling``).

Numbers and switches are typed as OpenAI's API types them: an integer field
takes an integer (not ``true``, ``"5"`` or ``5.0``), a number field an integer
or a float (not a string or a boolean), a boolean field ``true``/``false``.
pydantic's lax mode would coerce them instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

Number = Annotated[float, Strict()]  # an int or a float, never a bool or a numeric string

# Parameters with a non-null default that OpenAI still takes as null (its API marks them nullable, and the
# openai client sends null for one given as None): null is the default, not a 400.
NULL_IS_DEFAULT = frozenset(
    {
        "temperature",
        "top_p",
        "n",
        "stream",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "ignore_eos",
    }
)
MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound, and vLLM's default max_logprobs


def _nothing(*values: Any) -> Callable[[Any], bool]:
    return lambda v: any(v == x and type(v) is type(x) for x in values)


_OFF = _nothing(None, False)
_EMPTY = _nothing(None, [], {}, "")

#: Parameters OpenAI or vLLM clients send that calctl does not implement, with the values that ask for
#: nothing (null, off, empty, the documented default): any other value is a 400 naming the parameter.
REFUSED: dict[str, Callable[[Any], bool]] = {
    "best_of": _nothing(None, 1),
    "echo": _OFF,  # prompt logprobs need every prompt position's logits; a prefill job returns the last row
    "suffix": _EMPTY,
    "tools": _EMPTY,
    "functions": _EMPTY,
    "tool_choice": _nothing(None, "none", "auto"),  # without tools, "auto" is "none"
    "function_call": _nothing(None, "none", "auto"),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "store": _OFF,
    "service_tier": _nothing(None, "auto", "default"),
    "modalities": lambda v: v is None or v == ["text"],
    "audio": _EMPTY,
    "prediction": _EMPTY,
    "reasoning_effort": _EMPTY,
    "web_search_options": _EMPTY,
    "verbosity": _EMPTY,
    # vLLM's extensions
    "use_beam_search": _OFF,
    "length_penalty": _nothing(None, 1, 1.0),
    "min_tokens": _nothing(None, 0),
    "stop_token_ids": _EMPTY,
    "include_stop_str_in_output": _OFF,
    "skip_special_tokens": _nothing(None, True),
    "spaces_between_special_tokens": _nothing(None, True),
    "prompt_logprobs": _nothing(None, 0),
    "allowed_token_ids": _EMPTY,
    "bad_words": _EMPTY,
    "guided_json": _EMPTY,
    "guided_regex": _EMPTY,
    "guided_choice": _EMPTY,
    "guided_grammar": _EMPTY,
    "structured_outputs": _EMPTY,
    "truncate_prompt_tokens": _nothing(None),
    "priority": _nothing(None, 0),
    "return_tokens_as_token_ids": _OFF,
    "logits_processors": _EMPTY,
    "chat_template": _EMPTY,
    "chat_template_kwargs": _EMPTY,
    "continue_final_message": _OFF,
    "documents": _EMPTY,
    "mm_processor_kwargs": _EMPTY,
}
#: Refused on one endpoint only: their "nothing" differs (vLLM adds special tokens to a completion prompt,
#: not to a rendered chat; a chat always ends with the generation prompt here).
REFUSED_COMPLETION = {
    "add_special_tokens": _nothing(None, True),
    # The chat endpoint's names: sent here they would be ignored, and the client would not get what it asked.
    "max_completion_tokens": _nothing(None),
    "top_logprobs": _nothing(None, 0),
}
#: What the message of a refused parameter says to use instead (one the other endpoint takes).
INSTEAD = {
    "max_completion_tokens": "/v1/completions takes max_tokens",
    "top_logprobs": "/v1/completions takes logprobs: N (the alternatives per token)",
}
REFUSED_CHAT = {"add_special_tokens": _nothing(None, False), "add_generation_prompt": _nothing(None, True)}


def _in_range(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> float:
    # Written so that NaN fails too: Python's json (and so Starlette's request.json()) reads NaN and Infinity.
    if not (low < value <= high if low_open else low <= value <= high):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value!r}")
    return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False
    # vLLM's extension: every chunk carries the usage so far, so a client can tell how many tokens a
    # delta covers (a character split across tokens is one delta for several tokens).
    continuous_usage_stats: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    # A 64-bit integer, as OpenAI and vLLM take it; the engine maps it onto numpy's unsigned seed space.
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    user: str | None = None
    timeout: Number | None = Field(default=None, gt=0, description="calctl extension: request deadline in seconds")
    # Sampling (calctl.serving.engine.sampling; docs/serve.md "Sampling parameters").
    top_k: StrictInt = 0  # vLLM: 0 or -1 keeps every token
    min_p: Number = 0.0
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    logit_bias: dict[str, Number] | None = None
    ignore_eos: StrictBool = False  # vLLM: the EOS token is generated like any other, up to max_tokens

    _refused_here: ClassVar[dict[str, Callable[[Any], bool]]] = {}

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        asks = v is not None and (v.include_usage or v.continuous_usage_stats)
        if asks and not info.data.get("stream", True):  # OpenAI and vLLM refuse it too: asked, never done
            raise ValueError("stream_options is only allowed with stream set to true")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError(f"top_k must be -1 or 0 (every token) or a positive integer, got {v}")
        return v

    @field_validator("min_p")
    @classmethod
    def _min_p(cls, v: float) -> float:
        return _in_range("min_p", v, 0.0, 1.0)

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _penalty(cls, v: float, info: ValidationInfo) -> float:
        return _in_range(str(info.field_name), v, -2.0, 2.0)

    @field_validator("repetition_penalty")
    @classmethod
    def _repetition(cls, v: float) -> float:
        return _in_range("repetition_penalty", v, 0.0, 2.0, low_open=True)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not re.fullmatch(r"[0-9]{1,10}", key):
                raise ValueError(f"logit_bias keys are token ids (decimal integers), got {key[:40]!r}")
            _in_range(f"logit_bias[{key}]", bias, -100.0, 100.0)
        return v

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in NULL_IS_DEFAULT)}
        return data

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported(self) -> tuple[str, str] | None:
        """The first parameter set to something calctl cannot honour, with the reason."""
        if self.n != 1:
            return "n", "only n=1 is supported"
        extra = self.model_extra or {}
        for name, asks_nothing in {**REFUSED, **self._refused_here}.items():
            # Unset, off, empty or the default asks for nothing calctl lacks (client libraries send
            # ``tools: []``, ``suffix: ""``, ``best_of: 1``).
            if name in extra and not asks_nothing(extra[name]):
                if name in INSTEAD:
                    return name, f"{name} is not a parameter of this endpoint: {INSTEAD[name]}"
                return name, f"{name} is not supported by this server (omit it, or send null or its default)"
        return None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[StrictInt]
    logprobs: StrictInt | None = None  # the legacy shape: how many alternatives per token, 0..20

    _refused_here = REFUSED_COMPLETION

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs(cls, v: Any) -> Any:
        if v is False:  # what a client sending a chat-style switch means by it: none
            return None
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {v}")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if all(isinstance(x, str) for x in v):
                if len(v) != 1:
                    raise ValueError("only one prompt per request is supported")
            elif not all(isinstance(x, int) and x >= 0 for x in v):
                raise ValueError("a token prompt must be a list of non-negative integers")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None

    _refused_here = REFUSED_CHAT

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs_null(cls, v: Any) -> Any:
        return False if v is None else v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not 0 <= v <= MAX_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {v}")
        if v and not info.data.get("logprobs"):  # OpenAI: "logprobs must be set to true"; 0 asks for nothing
            raise ValueError("top_logprobs needs logprobs set to true")
        return v
