"""``stopped_by_text``: the engine's verdict for a request it ended for its length is the client's (001 §14).

The response said ``stop`` when its text (what :class:`OutputText` sent) contained a stop string; the
record must say the same, whatever the quick whole-output check guessed first.
"""

from __future__ import annotations

import pytest

from calctl.serving.text import OutputText, stopped_by_text
from tests.unit.serving_api.fake_engine import package_codec

TEXT = "The board has two chips; each serves one model, and the lanes stay apart."


def _client_saw_stop(ids: list[int], context: list[int], stops: tuple[str, ...]) -> bool:
    text = OutputText(package_codec("model-a"), stops, context)
    return any(text.push(t)[1] for t in ids) or text.end()[1]


@pytest.mark.parametrize(
    "stops",
    [("chips",), ("apart.",), ("two ch",), ("zebra",), ("", "lanes"), ("The board",), ("Hello",), ("; each",)],
)
def test_the_verdict_is_what_the_client_was_sent(stops: tuple[str, ...]) -> None:
    codec = package_codec("model-a")
    context = codec.encode("Hello there. ")
    ids = codec.encode(TEXT)
    for n in range(1, len(ids) + 1):
        assert stopped_by_text(codec, stops, context, ids[:n]) == _client_saw_stop(ids[:n], context, stops), n


def test_the_prompt_text_is_never_a_stop() -> None:
    codec = package_codec("model-a")
    context = codec.encode("say zebra")  # the stop string is in the prompt, not in the output
    assert not stopped_by_text(codec, ("zebra",), context, codec.encode(" and more"))
    assert stopped_by_text(codec, ("zebra",), context, codec.encode(" a zebra"))


def test_the_eos_token_is_no_text() -> None:
    codec = package_codec("model-a")
    assert codec.eos_token_id is not None
    ids = codec.encode("one two")
    assert not stopped_by_text(codec, ("<|im_end|>",), [], [*ids, codec.eos_token_id])
