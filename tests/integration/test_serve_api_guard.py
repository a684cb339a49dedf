"""Issue 49 (the API part) and issue 54's serving item, on the real engine behind uvicorn (mock board).

* one request's body never stalls the others (001 §9.2): model A receiving the largest allowed body, model
  B's requests and ``/health/live`` still complete while A's is being processed;
* an aborted upload is one log line, never a traceback;
* a stop string completed by the last allowed token is ``stop`` in the response, the 001 §14 record and
  ``calctl_requests_total``;
* requests refused at admission (429, 503) have a record, a count and an ``X-Request-Id``;
* a prompt id outside the model's vocabulary is a 400 before the device, naming the id and the size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calctl.serving.api.guard import DEFAULT_MAX_BODY_BYTES
from tests.conftest import REPO, TEST_PUB
from tests.integration.serve_harness import COMBINED, Served, dual_config, golden, serving
from tests.waiting import wait_http_ready, wait_until

pytestmark = pytest.mark.slow


def _requests_total(s: Served, alias: str, outcome: str) -> float:
    for family in text_string_to_metric_families(s.engine.metrics_text().decode()):
        for sample in family.samples:
            if sample.name == "calctl_requests_total" and sample.labels == {"model": alias, "outcome": outcome}:
                return float(sample.value)
    return 0.0


def _record(s: Served, request_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def written() -> bool:
        found[:] = [r for r, _ in s.supervisor.metrics.records.recent("request") if r["request_id"] == request_id]
        return bool(found)

    wait_until(written, what=f"the 001 §14 record of {request_id}", timeout=10)
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def log_lines() -> Iterator[list[logging.LogRecord]]:
    """Every record logged by calctl and by uvicorn (whose loggers do not propagate to pytest's caplog)."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep(logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("calctl", "uvicorn", "uvicorn.error", "uvicorn.asgi")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


def test_the_largest_body_on_a_never_stalls_b_or_liveness() -> None:
    """001 §9.2: while model A's server-side work on the largest allowed body runs (JSON, schema, seconds of
    tokenizer), model B's requests and /health/live complete, several times over, before A is answered."""
    words = "calculet board prefill decode lanes chips tokens stream " * (DEFAULT_MAX_BODY_BYTES // 56)
    big = {"model": "model-a", "prompt": words[: DEFAULT_MAX_BODY_BYTES - 200], "max_tokens": 4}
    done: dict[str, float] = {}
    with serving(time_scale=0.05) as s:
        a: dict[str, httpx.Response] = {}

        def send_a() -> None:
            a["r"] = httpx.post(f"{s.v1}/completions", json=big, timeout=300)
            done["a"] = time.monotonic()

        sender = threading.Thread(target=send_a)
        sender.start()
        time.sleep(0.5)  # the 4 MiB upload over loopback takes milliseconds; A is now being processed
        assert "a" not in done, "A was answered before B was sent: the body is too small to prove anything"
        with httpx.Client(timeout=120) as c:
            for i in range(3):
                live = c.get(f"{s.url}/health/live")
                assert live.status_code == 200 and live.json() == {"status": "live"}
                done[f"live{i}"] = time.monotonic()
                b = c.post(f"{s.v1}/completions", json={"model": "model-b", "prompt": "Hi", "max_tokens": 2})
                assert b.status_code == 200, b.text
                done[f"b{i}"] = time.monotonic()
        sender.join(300)
    # A's prompt is far past the context: its answer is the 400 that comes after all that work.
    assert a["r"].status_code == 400 and a["r"].json()["error"]["param"] == "prompt", a["r"].text
    assert all(t < done["a"] for k, t in done.items() if k != "a"), done


def test_an_aborted_upload_is_one_log_line_not_a_traceback(log_lines: list[logging.LogRecord]) -> None:
    with serving() as s:
        host, port = s.url.removeprefix("http://").split(":")
        for path in ("/v1/completions", "/v1/chat/completions", "/internal/models/model-a/reload"):
            with socket.create_connection((host, int(port))) as sock:
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                )
                sock.sendall(head.encode() + b'{"model": "model-a", "prompt": "')  # then the client goes away
            wait_until(
                lambda p=path: any(
                    p in r.getMessage() and "closed the connection" in r.getMessage() for r in log_lines
                ),  # type: ignore[misc]
                what=f"the log line of the aborted upload to {path}",
                timeout=10,
            )
        assert httpx.get(f"{s.url}/health/live").status_code == 200
    aborted = [r for r in log_lines if "closed the connection" in r.getMessage()]
    assert len(aborted) == 3 and all(r.exc_info is None for r in aborted), aborted
    assert not [r for r in log_lines if r.exc_info is not None or "Exception in ASGI" in r.getMessage()]


def test_body_over_the_limit_is_413_naming_the_limit_and_at_the_limit_is_served() -> None:
    limit = 64 * 1024
    with serving(max_body_bytes=limit) as s:
        prompt = "x" * (limit + 1)
        r = httpx.post(f"{s.v1}/completions", json={"model": "model-b", "prompt": prompt}, timeout=30)
        assert r.status_code == 413 and r.headers["x-request-id"].startswith("req-")
        err = r.json()["error"]
        assert err["code"] == "request_too_large" and "65536 bytes" in err["message"]
        # Streamed without a declared length (chunked): counted as it arrives.
        chunks = iter([b'{"model": "model-b", "prompt": "', b"y" * limit, b'"}'])
        r = httpx.post(f"{s.v1}/completions", content=chunks, timeout=30)
        assert r.status_code == 413
        # Declared far past the limit: answered before the client sends the body.
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
            assert sock.recv(200).startswith(b"HTTP/1.1 413 ")
        # Over the limit with Expect: 100-continue (curl's way for large bodies): the 413 instead of the 100.
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {limit + 1}\r\n"
            sock.sendall(head.encode() + b"Expect: 100-continue\r\n\r\n")
            assert sock.recv(200).startswith(b"HTTP/1.1 413 ")
        # At the limit exactly: read, parsed and served.
        pad = limit - len(b'{"model": "model-b", "max_tokens": 2, "prompt": "Hi", "pad": ""}')
        body = b'{"model": "model-b", "max_tokens": 2, "prompt": "Hi", "pad": "' + b" " * pad + b'"}'
        assert len(body) == limit
        r = httpx.post(f"{s.v1}/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text


def _stop_at_last_token(s: Served, alias: str) -> tuple[list[int], int, str]:
    """(prompt ids, max_tokens k, stop) such that the greedy output's k-th token completes ``stop`` and no
    earlier text contains it."""
    prompt, tokens = golden(COMBINED, alias)

    def text(k: int) -> str:
        body = {"model": alias, "prompt": prompt, "max_tokens": k, "temperature": 0}
        r = httpx.post(f"{s.v1}/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
        return str(r.json()["choices"][0]["text"])

    before = text(2)
    for k in range(3, len(tokens) + 1):
        now = text(k)
        if len(now) > len(before) and now.startswith(before):
            stop = now[len(before) - 1 :] if before else now  # spans the boundary into the last token
            if stop not in now[:-1]:
                return prompt, k, stop
        before = now
    raise AssertionError(f"no token of {alias}'s golden output adds text")


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_completed_by_the_last_token_is_stop_everywhere(stream: bool) -> None:
    with serving() as s:
        prompt, k, stop = _stop_at_last_token(s, "model-b")
        stops_before = _requests_total(s, "model-b", "stop")
        body = {"model": "model-b", "prompt": prompt, "max_tokens": k, "temperature": 0, "stop": [stop]}
        r = httpx.post(f"{s.v1}/completions", json={**body, "stream": stream}, timeout=30)
        assert r.status_code == 200
        if stream:
            assert '"finish_reason":"stop"' in r.text, r.text
        else:
            assert r.json()["choices"][0]["finish_reason"] == "stop", r.text
        record = _record(s, r.headers["x-request-id"])
        assert record["finish_reason"] == "stop" and record["error_class"] is None, record
        assert record["output_tokens"] == k
        assert _requests_total(s, "model-b", "stop") == stops_before + 1
        assert _requests_total(s, "model-b", "length") >= 1  # the probes that found k ended for their length


def test_requests_refused_at_admission_have_a_record_a_count_and_a_request_id(tmp_path: Path) -> None:
    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"model": "model-a", "prompt": "The board has two chips", "max_tokens": 64, "temperature": 0}
            return await asyncio.gather(*[c.post(f"{url}/completions", json=body) for _ in range(40)])

    with serving(config=dual_config(tmp_path, a_waiting=1), time_scale=0.5) as s:
        responses = asyncio.run(burst(s.v1))
        refused = [r for r in responses if r.status_code == 429]
        assert refused, Counter(r.status_code for r in responses)
        ids = [r.headers["x-request-id"] for r in responses]
        assert len(set(ids)) == len(ids) and all(i.startswith("cmpl-") for i in ids)
        for r in refused:
            rec = _record(s, r.headers["x-request-id"])
            assert rec["model_alias"] == "model-a" and rec["error_class"] == "capacity" and rec["output_tokens"] == 0
            assert rec["finish_reason"] is None and rec["ttft_ms"] is None and rec["e2e_ms"] is not None
        assert _requests_total(s, "model-a", "capacity") == len(refused)
        # A 400 the HTTP layer decides (a prompt past the context, counted but never built) has its record too.
        r = httpx.post(f"{s.v1}/completions", json={"model": "model-a", "prompt": "word " * 400}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        rec = _record(s, r.headers["x-request-id"])
        assert rec["error_class"] == "invalid" and rec["prompt_tokens"] >= 256 and rec["output_tokens"] == 0
        assert _requests_total(s, "model-a", "invalid") == 1
        # A 404 has its record under the name the client sent, and no metric label of it.
        r = httpx.post(f"{s.v1}/completions", json={"model": "model-x", "prompt": "Hi"}, timeout=30)
        assert r.status_code == 404
        rec = _record(s, r.headers["x-request-id"])
        assert (rec["model_alias"], rec["error_class"], rec["chips"]) == ("model-x", "model_not_found", [])
        assert 'model="model-x"' not in s.engine.metrics_text().decode()
        # 503 at admission: the server is shutting down.
        s.engine.start_draining()
        r = httpx.post(f"{s.v1}/completions", json={"model": "model-b", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["x-request-id"].startswith("cmpl-")
        assert _record(s, r.headers["x-request-id"])["error_class"] == "unavailable"
        assert _requests_total(s, "model-b", "unavailable") == 1


def test_a_prompt_id_past_the_model_vocabulary_is_400_before_the_device() -> None:
    """Issue 54: a tokenizer that produces an id past ``vocab_size`` got 503 "retry the request" from the
    device; it is the request's 400, naming the id and the size, and no job ever reaches the board."""
    with serving() as s:
        codec = s.engine.codec("model-a")
        real = codec.encode_within

        def past_the_vocabulary(text: str, limit: int) -> tuple[list[int] | None, int]:
            ids, count = real(text, limit - 1)
            return (None if ids is None else [*ids, 1_000_000]), count + 1

        codec.encode_within = past_the_vocabulary  # type: ignore[method-assign]
        jobs_before = len(s.supervisor.metrics.records.recent("job", ["model-a"]))
        for path, body in (
            ("completions", {"model": "model-a", "prompt": "Hello", "max_tokens": 2}),
            ("chat/completions", {"model": "model-a", "messages": [{"role": "user", "content": "Hi"}]}),
        ):
            r = httpx.post(f"{s.v1}/{path}", json=body, timeout=30)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert "1000000" in err["message"] and "384" in err["message"], err
            assert err["param"] == ("prompt" if path == "completions" else "messages")
            assert _record(s, r.headers["x-request-id"])["error_class"] == "invalid"
        assert len(s.supervisor.metrics.records.recent("job", ["model-a"])) == jobs_before
        assert _requests_total(s, "model-a", "invalid") == 2


@pytest.mark.parametrize(("flag", "limit"), [((), 10485), (("--max-body-mb", "0.02"), 20971)])
def test_serve_takes_the_limit_from_its_config_and_the_flag_over_it(
    tmp_path: Path, flag: tuple[str, ...], limit: int
) -> None:
    config = dual_config(tmp_path)
    config.write_text(config.read_text() + "api: {max_body_mb: 0.01}\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "calctl", "serve", str(COMBINED), "--config", str(config)),
                *("--trusted-key", str(TEST_PUB), "--port", str(port), "--warmup-iterations", "1", *flag),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http_ready(url, proc, log=log, timeout=120)
            small = httpx.post(f"{url}/v1/completions", json={"model": "model-b", "prompt": "Hi", "max_tokens": 1})
            assert small.status_code == 200, small.text
            r = httpx.post(f"{url}/v1/completions", json={"model": "model-b", "prompt": "x" * limit}, timeout=30)
            assert r.status_code == 413 and f"limit of {limit} bytes" in r.json()["error"]["message"], r.text
        finally:
            proc.terminate()
            proc.wait(60)
    assert "Traceback" not in log.read_text()


def test_the_openai_client_retrieves_a_model_and_gets_404_for_an_unknown_one() -> None:
    with serving() as s:
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        listed = {m.id: m for m in client.models.list().data}
        for alias in ("model-a", "model-b"):
            model = client.models.retrieve(alias)
            assert model.id == alias and model.object == "model" and model.owned_by == "calctl"
            assert model.model_dump() == listed[alias].model_dump()
            assert (model.model_extra or {})["max_model_len"] == s.engine.context_limit(alias) == 256
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve("model-z")
        assert info.value.code == "model_not_found" and info.value.param == "model"
        assert info.value.response.headers["x-request-id"]
