"""The soak's mixed traffic: which request a client sends next (000 §17.3, 001 §12 Phase 5).

One request kind per row of :data:`KINDS`, drawn with its weight from a seeded
``random.Random`` per client, so a soak replays the same request sequence per
client for the same ``--seed``:

========  ======  =================================================================
kind      weight  what the client does
========  ======  =================================================================
stream    0.28    streams token by token (TTFT, ITL)
plain     0.20    waits for the whole result, as a non-streaming HTTP client
cancel    0.14    cancels after 0–4 tokens, or after 0–30 ms
deadline  0.10    sets a request deadline of 2–200 ms; it may expire queued or running
stop      0.10    ends early on its own decision (a stop string) after 1–4 tokens
long      0.10    long prompt (96–160 tokens) and long output (32–64 tokens), streaming
burst     0.05    a short request whose output ignores EOS (exact length)
invalid   0.03    prompt longer than the context: refused 400 before the device
========  ======  =================================================================

Prompt and output lengths vary per request and always fit the model's context
(except ``invalid``). Prompt token ids avoid the first three ids (special
tokens).

**Every answer is checked** (issue 50: a board that reports a job done before its logits are written must
fail the soak): every request but ``invalid`` takes its prompt from the soak's **reference pool**
(:func:`reference_pool`: :data:`POOL_PER_KIND` seeded prompts per kind and alias, with the kind's prompt
lengths) and decodes greedily, so each token it returns must equal the token of that prompt's B1 twin, decoded
on the board at the first load (:mod:`calctl.runners.soak.verify`). The kinds still cancel, stop, expire and
burst as above; a request's tokens are a prefix of its twin's.

This module builds requests; it does not send them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from calctl.runners.traffic import ClientPlan
from calctl.serving.protocol import GenerationRequest, SamplingParams

TENANT = "soak"
FIRST_TOKEN_ID = 3  # ids 0..2 are the tiny tokenizer's specials; real tokenizers have theirs low too


@dataclass(frozen=True)
class ModelLimits:
    """What a request must respect for one alias: the context limit and the vocabulary size."""

    context_limit: int
    vocab_size: int


Builder = Callable[[random.Random, ModelLimits], tuple[int, int, ClientPlan, dict[str, object]]]


def _lengths(rng: random.Random, lim: ModelLimits, prompt: tuple[int, int], output: tuple[int, int]) -> tuple[int, int]:
    p = min(rng.randint(*prompt), lim.context_limit - 1)
    o = min(rng.randint(*output), lim.context_limit - p)
    return max(1, p), max(1, o)


def _stream(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (1, 48), (1, 32))
    return p, o, ClientPlan("stream"), {"ignore_eos": rng.random() < 0.5}


def _plain(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (1, 48), (1, 32))
    return p, o, ClientPlan("plain", streaming=False), {"ignore_eos": rng.random() < 0.5}


def _cancel(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (1, 48), (8, 32))
    if rng.random() < 0.5:
        plan = ClientPlan("cancel", cancel_after_tokens=rng.randint(0, 4))
    else:
        plan = ClientPlan("cancel", cancel_after_s=rng.uniform(0.0, 0.03))
    return p, o, plan, {"ignore_eos": True}


def _deadline(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (1, 48), (4, 32))
    return p, o, ClientPlan("deadline"), {"timeout_s": rng.uniform(0.002, 0.2), "ignore_eos": True}


def _stop(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (1, 48), (8, 32))
    return p, o, ClientPlan("stop", stop_after_tokens=rng.randint(1, 4)), {"ignore_eos": True}


def _long(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (96, 160), (32, 64))
    return p, o, ClientPlan("long"), {"ignore_eos": rng.random() < 0.5}


def _burst(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    p, o = _lengths(rng, lim, (1, 8), (1, 4))
    return p, o, ClientPlan("burst", streaming=rng.random() < 0.5), {"ignore_eos": True}


def _invalid(rng: random.Random, lim: ModelLimits) -> tuple[int, int, ClientPlan, dict[str, object]]:
    return lim.context_limit + rng.randint(1, 16), rng.randint(1, 8), ClientPlan("invalid", streaming=False), {}


@dataclass(frozen=True)
class RequestKind:
    name: str
    weight: float
    build: Builder
    max_output: int  # the builder's longest output: the length of the kind's twins
    verified: bool = True  # takes a pooled prompt and decodes greedily (``invalid`` never reaches the device)


#: The mix, in one table (docstring above).
KINDS: tuple[RequestKind, ...] = (
    RequestKind("stream", 0.28, _stream, 32),
    RequestKind("plain", 0.20, _plain, 32),
    RequestKind("cancel", 0.14, _cancel, 32),
    RequestKind("deadline", 0.10, _deadline, 32),
    RequestKind("stop", 0.10, _stop, 32),
    RequestKind("long", 0.10, _long, 64),
    RequestKind("burst", 0.05, _burst, 4),
    RequestKind("invalid", 0.03, _invalid, 8, verified=False),
)

#: Prompts of the reference pool per verified kind and alias (each has a B1 twin decoded at the first load).
POOL_PER_KIND = 3


@dataclass(frozen=True)
class PoolPrompt:
    """One prompt of the reference pool: what requests of ``kind`` send, and the longest output they may ask."""

    kind: str
    prompt: tuple[int, ...]
    max_tokens: int  # the twin's length: no request of this prompt asks for more


def _prompt(rng: random.Random, length: int, limits: ModelLimits) -> tuple[int, ...]:
    hi = max(FIRST_TOKEN_ID + 1, limits.vocab_size)
    return tuple(rng.randrange(FIRST_TOKEN_ID, hi) for _ in range(length))


def reference_pool(
    alias: str, limits: ModelLimits, *, seed: int, kinds: tuple[RequestKind, ...] = KINDS
) -> tuple[PoolPrompt, ...]:
    """The seeded prompts every verified request of ``alias`` draws from (the same for every client)."""
    rng = random.Random(f"{seed}/{alias}/pool")
    pool: list[PoolPrompt] = []
    for kind in kinds:
        if not kind.verified:
            continue
        for _ in range(POOL_PER_KIND):
            length, _, _, _ = kind.build(rng, limits)
            out = max(1, min(kind.max_output, limits.context_limit - length))
            pool.append(PoolPrompt(kind.name, _prompt(rng, length, limits), out))
    return tuple(pool)


class MixedTraffic:
    """Draws the next request of one client. One instance per client (it owns the client's RNG)."""

    def __init__(
        self,
        alias: str,
        limits: ModelLimits,
        *,
        seed: int,
        client: int,
        kinds: tuple[RequestKind, ...] = KINDS,
        pool: tuple[PoolPrompt, ...] | None = None,
    ) -> None:
        self.alias = alias
        self.limits = limits
        self.client = client
        self._rng = random.Random(f"{seed}/{alias}/{client}")
        self._kinds = kinds
        self._weights = [k.weight for k in kinds]
        self._n = 0
        self._pool: dict[str, list[PoolPrompt]] = {}
        for entry in pool if pool is not None else reference_pool(alias, limits, seed=seed, kinds=kinds):
            self._pool.setdefault(entry.kind, []).append(entry)

    def next(self) -> tuple[GenerationRequest, ClientPlan]:
        rng = self._rng
        kind = rng.choices(self._kinds, weights=self._weights)[0]
        prompt_len, max_tokens, plan, extra = kind.build(rng, self.limits)
        self._n += 1
        entries = self._pool.get(kind.name)
        if kind.verified and entries:
            entry = rng.choice(entries)  # a pooled prompt, greedy: its tokens are checked against its twin
            prompt, max_tokens = entry.prompt, min(max_tokens, entry.max_tokens)
        else:
            prompt = _prompt(rng, prompt_len, self.limits)
        req = GenerationRequest(
            request_id=f"soak-{self.alias}-c{self.client}-{self._n}",
            alias=self.alias,
            tenant=TENANT,
            prompt_ids=prompt,
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=0.0),
            timeout_s=extra.get("timeout_s"),  # type: ignore[arg-type]
            ignore_eos=bool(extra.get("ignore_eos", False)),
        )
        return req, plan


__all__ = [
    "KINDS",
    "POOL_PER_KIND",
    "TENANT",
    "MixedTraffic",
    "ModelLimits",
    "PoolPrompt",
    "RequestKind",
    "reference_pool",
]
