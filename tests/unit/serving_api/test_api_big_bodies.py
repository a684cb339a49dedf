"""Large request bodies beside small ones (001 §9.2, issue 49): the byte scan of a token-id prompt and priorities.

A completions body whose prompt lists more token ids than the model's context is refused from a scan of its
bytes (``bodies.refuse_long_ids``): no JSON parser builds its million ints while holding the interpreter lock
the event loop needs. The scan must say exactly what the full parse says, or step aside; its grammar is checked
here against ``json.loads``. A small prompt is tokenized at the normal priority, a large one below it.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calctl.serving.api import bodies, guard, openai
from calctl.serving.api.bodies import _count_ids
from calctl.serving.api.workers import BIG_BODY, INLINE_BODY, PROMPT_NICE
from tests.unit.serving_api.fake_engine import CONTEXT_LIMIT, FakeEngine, package_codec

pytestmark = pytest.mark.anyio

MANY = 300_000  # ids: a body well over BIG_BODY


def _ids(n: int, sep: str = ",") -> str:
    return sep.join(str(5 + i % 300) for i in range(n))


def _reference(inside: str) -> int | None:
    """What a JSON parser makes of ``[inside]``: its length when it is a list of non-negative ints, else None."""
    try:
        doc = json.loads(f"[{inside}]")
    except ValueError:
        return None
    ok = doc and all(type(x) is int and x >= 0 for x in doc)
    return len(doc) if ok else None


@pytest.mark.parametrize(
    "inside",
    [
        "1,2,3",
        "1, 2, 3 ",
        "\n 1,\n 2\n",
        "\t1,\r\n2",
        "0,0,10",
        "1,0",
        "0",
        "10,200,3000",
        "1, 2 ,3",  # valid JSON the scan leaves to the parser (None, not a wrong count)
        "1 2,3",
        "1,,2",
        "1, ,2",
        ",1",
        "1,",
        " ,1",
        "01,2",
        "1, 02",
        "00",
        "",
        " ",
        "1-2",
        "-1,2",
        "1.0,2",
        "1e3",
        "1\x0b,2",
    ],
)
def test_the_scan_counts_exactly_what_a_json_parser_reads_or_steps_aside(inside: str) -> None:
    got = _count_ids(inside.encode(), 0, len(inside.encode()))
    assert got is None or got == _reference(inside), (inside, got)
    if inside in ("1,2,3", "1, 2, 3 ", "0,0,10", "10,200,3000"):
        assert got == 3


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(alphabet="0159,, \n\t-.x", max_size=24))
def test_the_scan_never_counts_what_a_json_parser_refuses(inside: str) -> None:
    got = _count_ids(inside.encode(), 0, len(inside.encode()))
    assert got is None or got == _reference(inside), (inside, got)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=40), st.sampled_from([",", ", ", ",\n  "]))
def test_the_scan_counts_every_list_a_client_library_writes(ids: list[int], sep: str) -> None:
    inside = sep.join(map(str, ids))
    assert _count_ids(inside.encode(), 0, len(inside)) == len(ids)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(alphabet="0159,, \n\t-x", max_size=30), st.sampled_from([1, 2, 3, 4, 7]))
def test_the_scan_in_blocks_reads_what_a_json_parser_reads_at_every_block_boundary(inside: str, block: int) -> None:
    """The scan works in blocks of SCAN_BLOCK bytes: a number, a comma or a leading zero cut by a block's edge
    is judged as in one piece."""
    raw = inside.encode()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bodies, "SCAN_BLOCK", block)
        got = _count_ids(raw, 0, len(raw))
    assert got == _count_ids(raw, 0, len(raw)), (inside, block)  # the same as in one block
    assert got is None or got == _reference(inside), (inside, block, got)
    ids = [int(t) for t in inside.replace(",", " ").split() if t.isdigit() and (t == "0" or t[0] != "0")]
    if ids:
        clean = ",".join(map(str, ids)).encode()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bodies, "SCAN_BLOCK", block)
            assert _count_ids(clean, 0, len(clean)) == len(ids), (clean, block)


def test_the_scan_of_a_big_body_never_makes_an_array_larger_than_its_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """No numpy temporary as large as the body: each would be megabytes of freshly mapped memory per body."""
    seen: list[int] = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            real = getattr(np, name)
            if not callable(real) or name in ("frombuffer", "uint8", "dtype", "ndarray"):
                return real

            def call(*args: Any, **kw: Any) -> Any:
                seen.extend(a.size for a in args if isinstance(a, np.ndarray))
                return real(*args, **kw)

            return call

    monkeypatch.setattr(bodies, "np", Spy())
    raw = f"[{_ids(MANY)}]".encode()
    assert len(raw) > 8 * bodies.SCAN_BLOCK
    assert _count_ids(raw, 1, len(raw) - 1) == MANY
    assert seen and max(seen) <= bodies.SCAN_BLOCK + 2, max(seen)


async def test_a_large_body_is_joined_off_the_event_loop_and_reaches_the_route_uncopied(
    client: httpx.AsyncClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A megabyte copy on the event loop stalls every other request: the guard joins a large body's chunks in
    a worker thread, and the route scans that very object (Request.body() would copy it again, on the loop)."""
    joined: list[tuple[int, bytes]] = []
    scanned: list[bytes] = []
    real_join, real_scan = guard.join_parts, openai.refuse_long_ids

    def join_parts(parts: list[bytes]) -> bytes:
        body = real_join(parts)
        joined.append((threading.get_ident(), body))
        return body

    def refuse_long_ids(raw: bytes, context_of: Any) -> None:
        scanned.append(raw)
        real_scan(raw, context_of)

    monkeypatch.setattr(guard, "join_parts", join_parts)
    monkeypatch.setattr(openai, "refuse_long_ids", refuse_long_ids)
    body = f'{{"model": "model-a", "max_tokens": 4, "prompt": [{_ids(MANY * 2)}]}}'.encode()
    assert len(body) >= guard.JOIN_OFF_LOOP
    r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    ((thread, built),), (raw,) = joined, scanned
    assert thread != threading.get_ident() and built == body
    assert raw is built


async def test_a_large_text_prompt_is_joined_on_the_loop_not_in_a_worker(
    client: httpx.AsyncClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a token-id prompt's body is joined in a worker thread: beside 4 MiB text bodies that made model B's P99
    TTFT worse, not better (bench_big_body.py --kind text)."""
    joined: list[int] = []
    real_join = guard.join_parts

    def join_parts(parts: list[bytes]) -> bytes:
        joined.append(threading.get_ident())
        return real_join(parts)

    monkeypatch.setattr(guard, "join_parts", join_parts)
    text = "calculet " * (guard.JOIN_OFF_LOOP // 9 + 1)
    body = json.dumps({"model": "model-a", "max_tokens": 4, "prompt": text}).encode()
    assert len(body) >= guard.JOIN_OFF_LOOP
    r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert joined == []
    assert bodies.ids_prompt(b'{"model": "a", "prompt" : [1, 2]}') and not bodies.ids_prompt(b'{"prompt": "[1]"}')


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every document the API handed to a JSON parser."""
    sizes: list[int] = []
    real = bodies._json

    def spy(raw: bytes) -> Any:
        sizes.append(len(raw))
        return real(raw)

    monkeypatch.setattr(bodies, "_json", spy)
    return sizes


async def test_a_token_id_prompt_past_the_context_is_refused_without_parsing_its_ids(
    client: httpx.AsyncClient, engine: FakeEngine, parsed: list[int]
) -> None:
    body = f'{{"model": "model-a", "max_tokens": 4, "prompt": [{_ids(MANY, ", ")}]}}'.encode()
    assert len(body) >= BIG_BODY
    r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and f"prompt has {MANY} tokens" in err["message"], err
    assert f"context limit {CONTEXT_LIMIT}" in err["message"]
    assert parsed and max(parsed) < 1024, parsed  # only the body without its array was parsed
    assert [(f.alias, f.prompt_tokens) for f in engine.refusals] == [("model-a", MANY)]
    assert engine.submitted == []


@pytest.mark.parametrize(
    ("template", "status", "code"),
    [
        # the key the scan finds is not the document's own prompt: the full parse decides
        ('{{"model": "model-b", "max_tokens": 2, "extra": {{"prompt": [{ids}]}}, "prompt": "hi"}}', 200, None),
        ('{{"model": "model-b", "max_tokens": 2, "prompt": [{ids}], "prompt": "hi"}}', 200, None),
        ('{{"model": "model-b", "max_tokens": 2, "x\\"prompt": [{ids}], "prompt": "hi"}}', 200, None),
        # not JSON, however the array looks
        ('{{"model": "model-a", "prompt": [{ids}],}}', 400, "invalid_json"),
        ('{{"model": "model-a", "prompt": [0{ids}]}}', 400, "invalid_json"),
        ('{{"model": "model-a", "prompt": [{ids},]}}', 400, "invalid_json"),
        # a model the server does not have: its 404 first, as on the full path
        ('{{"model": "model-z", "prompt": [{ids}]}}', 404, "model_not_found"),
    ],
)
async def test_the_scan_gives_the_full_parse_answer_for_bodies_it_cannot_judge(
    client: httpx.AsyncClient, engine: FakeEngine, template: str, status: int, code: str | None
) -> None:
    body = template.format(ids=_ids(MANY)).encode()
    r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text[:300]
    if code is not None:
        assert r.json()["error"]["code"] == code, r.text[:300]
    else:
        assert engine.submitted[-1].prompt_ids == tuple(package_codec("model-b").encode("hi"))


async def test_a_small_prompt_is_tokenized_at_normal_priority_and_a_big_one_below_it(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A niced thread for B's two-token prompt would share the CPU left over with A's megabyte prompts one to
    one; at the normal priority it gets its turn first (001 §9.2)."""
    seen: list[tuple[str, int]] = []
    codec = package_codec("model-b")
    real = codec.encode_within

    def encode_within(text: str, limit: int) -> tuple[list[int] | None, int]:
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return real(text, limit)

    monkeypatch.setattr(codec, "encode_within", encode_within)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    # Over INLINE_BODY (under it the prompt is tokenized on the event loop), under BIG_BODY.
    medium = {"model": "model-b", "prompt": "hi", "max_tokens": 2, "pad": " " * INLINE_BODY}
    small = await client.post("/v1/completions", json=medium)
    big = {"model": "model-b", "prompt": "hi", "max_tokens": 2, "pad": " " * BIG_BODY}
    large = await client.post("/v1/completions", json=big)
    assert small.status_code == large.status_code == 200, (small.text, large.text)
    (small_thread, small_nice), (big_thread, big_nice) = seen
    assert small_thread.startswith("api-prompt-model-b_") and small_nice == base
    assert big_thread.startswith("api-prompt-model-b-big") and big_nice == min(19, base + PROMPT_NICE)
