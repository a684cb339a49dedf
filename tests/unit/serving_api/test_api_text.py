"""The text helpers the API streams with: StopMatcher and IncrementalDetokenizer, over any split of the text."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calctl.serving.text import IncrementalDetokenizer, StopMatcher
from tests.unit.serving_api.fake_engine import package_codec

ALPHABET = "ab c.\n" + "é✓日本" + "\U0001f600"


def run_matcher(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for d in deltas:
        safe, stopped = m.feed(d)
        out.append(safe)
        if stopped:
            return "".join(out), True
    return "".join(out) + m.flush(), False


@st.composite
def split_text(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(st.text(alphabet="abc.", max_size=30))
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=len(text) + 1)))
    bounds = [0, *cuts, len(text)]
    return text, [text[i:j] for i, j in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None)
@given(split_text(), st.lists(st.text(alphabet="abc.", min_size=1, max_size=4), min_size=1, max_size=4))
def test_stop_matcher_over_any_split(case: tuple[str, list[str]], stops: list[str]) -> None:
    text, deltas = case
    out, stopped = run_matcher(stops, deltas)
    assert text.startswith(out)  # never invents or reorders text
    if stopped:
        assert any(text[len(out) :].startswith(s) for s in stops)  # cut exactly where a stop string begins
        assert not any(s in out for s in stops)  # and no stop string was sent
    else:
        assert out == text  # nothing held back at the end
        assert not any(s in text for s in stops)


@settings(max_examples=100, deadline=None)
@given(split_text(), st.text(alphabet="abc.", min_size=1, max_size=4))
def test_single_stop_cuts_at_its_first_occurrence(case: tuple[str, list[str]], stop: str) -> None:
    text, deltas = case
    out, stopped = run_matcher([stop], deltas)
    assert (out, stopped) == ((text[: text.find(stop)], True) if stop in text else (text, False))


def test_stop_matcher_without_stops_passes_everything() -> None:
    assert run_matcher([], ["ab", "c"]) == ("abc", False)
    assert run_matcher([""], ["ab", "c"]) == ("abc", False)


@pytest.mark.parametrize("alias", ["model-a", "model-b"])
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=40))
def test_detokenizer_deltas_add_up_and_never_split_a_character(alias: str, text: str) -> None:
    codec = package_codec(alias)
    ids = codec.encode(text)
    detok = IncrementalDetokenizer(codec)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == codec.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)
    assert detok.text == text


def test_detokenizer_skips_eos() -> None:
    codec = package_codec("model-a")
    detok = IncrementalDetokenizer(codec)
    assert codec.eos_token_id is not None
    assert [detok.push(i) for i in [*codec.encode("hi"), codec.eos_token_id]][-1] == ""
    assert detok.text == "hi"
