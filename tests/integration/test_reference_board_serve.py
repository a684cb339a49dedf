"""Issue 18 acceptance: ``calctl serve --device calrt`` on the reference board, as a user starts it.

The server runs as its own process (``python -m calctl serve``), so the whole path is
the shipped one: CLI, supervisor, engine, ctypes, the C board's worker threads. The
OpenAI client gets the package's golden tokens from both aliases, streaming and
not; streams abandoned mid-way leave nothing behind: the next requests are still
exact, and SIGTERM drains to exit 0 with the board released.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
from openai.types.chat import ChatCompletionMessageParam
from tokenizers import Tokenizer

from calctl.package.reader import load_manifest
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)
from tests.waiting import wait_http_ready, wait_until

PKG = FIXTURE_PACKAGES / "combined"
ALIASES = ("model-a", "model-b")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(lib: Path, tmp: Path) -> Iterator[Server]:
    port = _free_port()
    log = tmp / "serve.log"
    env = {**os.environ, "CALCTL_CACHE_DIR": str(tmp / "cache"), "CALRT_REF_TIME_SCALE": "0.05"}
    cmd = [sys.executable, "-m", "calctl", "serve", str(PKG), "--trusted-key", str(TEST_PUB)]
    cmd += ["--device", "calrt", "--calrt-lib", str(lib), "--port", str(port), "--warmup-iterations", "1"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(url, proc, log=log, timeout=90)
        yield Server(url, proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _golden_text(alias: str) -> tuple[list[int], str, int]:
    m = load_manifest(PKG).model(alias)
    prompt = np.load(PKG / m.golden.prompt.file)[0].tolist()
    tokens = np.load(PKG / m.golden.decode_tokens.file).tolist()
    eos = m.architecture.eos_token_id
    if eos in tokens:
        tokens = tokens[: tokens.index(eos)]
    tok = Tokenizer.from_file(str(PKG / m.tokenizer.file))
    return prompt, tok.decode(tokens, skip_special_tokens=True), len(np.load(PKG / m.golden.decode_tokens.file))


def _assert_golden(client: openai.OpenAI) -> None:
    for alias in ALIASES:
        prompt, want, n = _golden_text(alias)
        r = client.completions.create(model=alias, prompt=prompt, max_tokens=n, temperature=0)
        assert r.choices[0].text == want, alias
        assert r.usage is not None and r.usage.prompt_tokens == len(prompt)
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(model=alias, prompt=prompt, max_tokens=n, temperature=0, stream=True)
        )
        assert streamed == want, alias


def test_openai_client_gets_golden_tokens_through_the_c_abi(reference_board: Path, tmp_path: Path) -> None:  # noqa: F811
    with _serve(reference_board, tmp_path) as s:
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        assert sorted(m.id for m in client.models.list().data) == list(ALIASES)
        _assert_golden(client)
        # Issue 28: a software model says so in the log and in the device label of /metrics.
        assert "a software model; its results are not hardware evidence" in s.log.read_text()
        metrics = httpx.get(f"{s.url}/metrics", timeout=10).text
        assert 'device="calrt-software-model"' in metrics, [m for m in metrics.splitlines() if "board_info" in m]
        for alias in ALIASES:
            msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello board"}]
            chat = client.chat.completions.create(model=alias, messages=msgs, max_tokens=8, temperature=0)
            assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage is not None
            chunks = list(
                client.chat.completions.create(model=alias, messages=msgs, max_tokens=8, temperature=0, stream=True)
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == chat.choices[0].message.content
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0, s.log.read_text()[-3000:]
    assert "Traceback" not in s.log.read_text()


def test_abandoned_streams_leave_nothing_behind(reference_board: Path, tmp_path: Path) -> None:  # noqa: F811
    rng = random.Random(18)
    outcomes: dict[str, int] = {}

    async def one(c: httpx.AsyncClient, url: str, i: int) -> None:
        body = {"model": ALIASES[i % 2], "prompt": f"stream {i}", "max_tokens": rng.randint(4, 24), "stream": True}
        body.update(temperature=0.7, seed=i)
        abandon = i % 3 != 0
        async with c.stream("POST", f"{url}/v1/completions", json=body) as r:
            n = 0
            async for _ in r.aiter_lines():
                n += 1
                if abandon and n >= rng.randint(1, 4):
                    break  # leaving the context closes the connection mid-stream
            key = f"{'abandoned' if abandon else 'complete'}:{r.status_code}"
            outcomes[key] = outcomes.get(key, 0) + 1

    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            await asyncio.gather(*[one(c, url, i) for i in range(36)])

    with _serve(reference_board, tmp_path) as s:
        asyncio.run(run(s.url))
        assert sum(outcomes.values()) == 36 and set(outcomes) <= {"abandoned:200", "complete:200"}, outcomes
        # The lanes and buffers of the abandoned streams came back: the next requests are exact.
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        wait_until(
            lambda: httpx.get(f"{s.url}/health/ready", timeout=5).status_code == 200,
            what="the board to be ready again after the abandoned streams",
            interval=0.1,
            detail=lambda: httpx.get(f"{s.url}/health/ready", timeout=5).text,
        )
        _assert_golden(client)
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0, s.log.read_text()[-3000:]  # 0: every accepted request finished
    assert "Traceback" not in s.log.read_text()
