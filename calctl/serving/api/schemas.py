"""OpenAI request bodies, validated with pydantic before anything reaches the engine.

Unknown fields are accepted and ignored (clients send many), but a field calctl
cannot honour with a non-default value (``n > 1``, ``logprobs``, ``echo``,
``best_of``, tools) is a 400 naming the parameter, never silently ignored.

Numbers and switches are typed as OpenAI's API types them: an integer field
takes an integer (not ``true``, ``"5"`` or ``5.0``), a number field an integer
or a float (not a string or a boolean), a boolean field ``true``/``false``.
pydantic's lax mode would coerce them instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, field_validator, model_validator

Number = Annotated[float, Strict()]  # an int or a float, never a bool or a numeric string

# Parameters with a non-null default that OpenAI still takes as null (its API marks them nullable, and the
# openai client sends null for one given as None): null is the default, not a 400.
NULL_IS_DEFAULT = frozenset({"temperature", "top_p", "n", "stream"})


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
        for name in (
            "logprobs",
            "top_logprobs",
            "best_of",
            "echo",
            "suffix",
            "tools",
            "functions",
            "response_format",
            "logit_bias",
        ):
            value = extra.get(name)
            # Unset, off or empty asks for nothing calctl lacks (client libraries send ``tools: []``,
            # ``suffix: ""``); only best_of=1 and response_format text are non-empty defaults.
            if (
                value in (None, False, 0, "", [], {})
                or (name == "best_of" and value == 1)
                or (name == "response_format" and value == {"type": "text"})
            ):
                continue
            return name, f"{name} is not supported by this server"
        return None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[StrictInt]

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
