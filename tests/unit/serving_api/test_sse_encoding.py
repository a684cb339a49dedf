"""SSE events of the streaming endpoints: one compact JSON document per ``data:`` line, whichever encoder wrote it.

The chunks go through orjson (a dependency) when it can encode them and through the standard library otherwise;
a client parses both to the same document, and text that is not ASCII arrives as UTF-8.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calctl.serving.api import openai


def _parse(event: bytes) -> tuple[str | None, Any]:
    assert event.endswith(b"\n\n"), event
    lines = event[:-2].decode("utf-8").split("\n")
    name = lines[0].removeprefix("event: ") if lines[0].startswith("event: ") else None
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert len(data) == 1, event  # one line: a newline inside the JSON would split the event
    return name, json.loads(data[0].removeprefix("data: "))


def test_the_sse_chunks_are_written_by_orjson() -> None:
    assert openai.orjson is not None  # a dependency of calctl (pyproject.toml)


TEXT = st.text(st.characters(codec="utf-8"), max_size=12)  # what a detokenizer yields: no surrogates


@settings(max_examples=200, deadline=None)
@given(text=TEXT, n=st.integers(0, 2**63 - 1), finish=st.sampled_from([None, "stop", "length"]))
def test_a_chunk_parses_back_to_its_document_with_either_encoder(text: str, n: int, finish: str | None) -> None:
    doc = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": n,
        "model": "model-a",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
    }
    fast = openai._sse_event(doc)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(openai, "orjson", None)
        slow = openai._sse_event(doc)
    assert _parse(fast) == _parse(slow) == (None, doc)


def test_non_ascii_text_is_sent_as_utf8() -> None:
    text = "é日本\U0001f600\u2028"
    event = openai._sse_event({"choices": [{"text": text}]})
    assert text.encode("utf-8") in event
    assert _parse(event) == (None, {"choices": [{"text": text}]})


def test_what_orjson_cannot_encode_goes_through_the_standard_library() -> None:
    big = {"usage": {"completion_tokens": 2**70}}  # beyond orjson's 64-bit integers
    assert _parse(openai._sse_event(big)) == (None, big)


def test_an_error_event_names_itself() -> None:
    err = {"error": {"message": "model-a: no", "type": "service_unavailable", "code": "device_error"}}
    assert _parse(openai._sse_event(err, "error")) == ("error", err)
