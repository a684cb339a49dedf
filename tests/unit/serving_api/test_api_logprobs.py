"""Log-probabilities in OpenAI's shapes: token strings and bytes, legacy text offsets, and the deltas that carry
them (the EOS that ends an output is not listed; a stop string's tokens are)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calctl.serving.api.deltas import text_deltas
from calctl.serving.api.logprobs import CompletionLogprobs, TokenNames, chat_logprobs
from calctl.serving.protocol import FinishReason, TokenEvent, TokenLogprob
from tests.unit.serving_api.fake_engine import EOS_TOKEN_ID, package_codec

CODEC = package_codec("model-a")
NAMES = TokenNames(CODEC)


def test_token_text_is_its_characters_or_the_bytes_form() -> None:
    ids = CODEC.encode("a ça")
    assert [NAMES.of(i) for i in ids] == [
        ("a", b"a"),
        (" ", b" "),
        ("bytes:\\xc3", b"\xc3"),
        ("bytes:\\xa7", b"\xa7"),
        ("a", b"a"),
    ]
    assert NAMES.of(EOS_TOKEN_ID) == ("<|im_end|>", b"<|im_end|>")
    assert EOS_TOKEN_ID in NAMES.special


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab c.\n" + "é✓日本" + "\U0001f600", max_size=20))
def test_token_bytes_join_into_the_text_and_offsets_point_into_it(text: str) -> None:
    ids = CODEC.encode(text)
    assert b"".join(NAMES.of(i)[1] for i in ids).decode() == text
    legacy = CompletionLogprobs(NAMES).of([TokenLogprob(i, -1.0) for i in ids])
    for token, offset in zip(legacy["tokens"], legacy["text_offset"], strict=True):
        if not token.startswith("bytes:"):
            assert text[offset : offset + len(token)] == token
        else:  # part of a character: its offset is that character's
            assert 0 <= offset < len(text) and ord(text[offset]) > 127


def test_offsets_of_invalid_bytes_and_special_tokens_match_the_decoded_text() -> None:
    ids = [230, 163, 195, 248, 222, 0, 35, 240, 235, 355]  # bytes \x85 \xe4 \x04 \x97 \x1f <|endoftext|> A ...
    assert CODEC.decode(ids) == "\ufffd\ufffd\x04\ufffd\x1fA\ufffd\ufffdCal"
    assert CompletionLogprobs(NAMES).of([TokenLogprob(i, -1.0) for i in ids])["text_offset"] == [
        0,
        1,
        2,
        3,
        4,
        5,
        5,
        6,
        7,
        8,
    ]


def test_offsets_carry_on_across_chunks() -> None:
    ids = CODEC.encode("a ça va")
    whole = CompletionLogprobs(NAMES).of([TokenLogprob(i, -1.0) for i in ids])["text_offset"]
    chunked = CompletionLogprobs(NAMES)
    parts = [chunked.of([TokenLogprob(i, -1.0)])["text_offset"] for i in ids]
    assert [o for p in parts for o in p] == whole


def test_shapes() -> None:
    h, e = CODEC.encode("H")[0], CODEC.encode("e")[0]
    entry = TokenLogprob(h, -0.5, ((h, -0.5), (e, -1.5)))
    assert chat_logprobs([entry], NAMES) == {
        "content": [
            {
                "token": "H",
                "logprob": -0.5,
                "bytes": [72],
                "top_logprobs": [
                    {"token": "H", "logprob": -0.5, "bytes": [72]},
                    {"token": "e", "logprob": -1.5, "bytes": [101]},
                ],
            }
        ],
        "refusal": None,
    }
    # legacy: the sampled token is always in top_logprobs, even beyond the n asked for
    unlikely = TokenLogprob(e, -3.0, ((h, -0.5),))
    assert CompletionLogprobs(NAMES).of([unlikely]) == {
        "tokens": ["e"],
        "token_logprobs": [-3.0],
        "top_logprobs": [{"H": -0.5, "e": -3.0}],
        "text_offset": [0],
    }


class _Stream:
    request_id = "r"

    def __init__(self, events: list[TokenEvent]) -> None:
        self.events = events
        self.finished: list[FinishReason] = []

    async def admitted(self) -> None:
        return None

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        async def gen() -> AsyncIterator[TokenEvent]:
            for ev in self.events:
                yield ev

        return gen()

    def cancel(self, reason: str = "cancelled") -> None:
        return None

    def finish(self, reason: FinishReason) -> None:
        self.finished.append(reason)


def _events(ids: list[int], end: FinishReason | None) -> list[TokenEvent]:
    evs = [
        TokenEvent(t, prompt_tokens=1, completion_tokens=n + 1, logprob=TokenLogprob(t, -float(n + 1)))
        for n, t in enumerate(ids)
    ]
    if end is not None:
        evs.append(TokenEvent(None, end, prompt_tokens=1, completion_tokens=len(ids)))
    return evs


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_deltas_leave_out_the_ending_eos_and_keep_a_stop_strings_tokens(anyio_backend: str) -> None:
    ids = CODEC.encode("a ça")
    deltas = [d async for d in text_deltas(_Stream(_events([*ids, EOS_TOKEN_ID], FinishReason.STOP)), CODEC, [])]
    entries = [e.token_id for d in deltas for e in d.logprobs]
    assert entries == ids and deltas[-1].usage["completion_tokens"] == len(ids)
    # A held partial character's token rides with the delta that completes it.
    assert [len(d.logprobs) for d in deltas if d.text] == [1, 1, 2, 1]

    stop_ids = CODEC.encode("Hello world")
    stream = _Stream(_events(stop_ids, None))
    deltas = [d async for d in text_deltas(stream, CODEC, ["wor"])]
    assert "".join(d.text for d in deltas) == "Hello "
    assert deltas[-1].finish == "stop" and stream.finished == [FinishReason.STOP]
    got = [e.token_id for d in deltas for e in d.logprobs]
    assert got == stop_ids[: len(got)] and CODEC.decode(got).endswith("wor")
