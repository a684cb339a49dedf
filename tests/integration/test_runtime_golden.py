"""Issue 4 acceptance: prefill + greedy decode of every sample package on the mock board reproduce
the package's golden tokens exactly and its prefill logits within the manifest tolerance.

Both models of a two-model package run at the same time, from two threads, as a runner will
(001 §6.4: A golden, B golden, then A+B concurrently): crosstalk between chips would show here.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from calctl.package.model import Package
from calctl.package.reader import load_manifest
from calctl.runtime import GenerationId, Runtime, open_runtime

PACKAGES = Path(__file__).resolve().parents[2] / "fixtures" / "packages"


def golden_run(rt: Runtime, pkg: Package, alias: str, generation: GenerationId) -> tuple[np.ndarray, list[int]]:
    """Prefill the golden prompt, then greedy-decode as many tokens as the golden has."""
    m = pkg.model(alias)
    prompt = np.load(pkg.root / m.golden.prompt.file).reshape(-1)
    steps = int(np.prod(m.golden.decode_tokens.shape))
    seq = rt.kv.allocate(alias)
    try:
        with rt.job_buffers(m.prefill.name) as (inputs, outputs):
            tokens = np.zeros(inputs.layout.slot("tokens").shape, np.int32)
            tokens[0, : len(prompt)] = prompt
            inputs.write("tokens", tokens)
            inputs.write("n_tokens", np.array([len(prompt)], np.int32))
            rt.kv.append(seq, len(prompt))
            rt.wait(rt.submit(m.prefill.name, inputs, outputs, kv=[seq], generation=generation), 30)
            rt.kv.commit(seq)
            prefill_logits = outputs.read("logits")
        out = [int(np.argmax(prefill_logits[0]))]
        with rt.job_buffers(m.decode.name) as (inputs, outputs):
            while len(out) < steps:
                position = rt.kv.append(seq, 1)
                inputs.write("tokens", np.array([[out[-1]]], np.int32))
                inputs.write("positions", np.array([position], np.int32))
                rt.wait(rt.submit(m.decode.name, inputs, outputs, kv=[seq], generation=generation), 30)
                rt.kv.commit(seq)
                out.append(int(np.argmax(outputs.read("logits")[0])))
        return prefill_logits, out
    finally:
        rt.kv.free(seq)


@pytest.mark.parametrize("kind", ["single", "combined", "replica"])
def test_golden_on_the_mock(kind: str) -> None:
    pkg = load_manifest(PACKAGES / kind)
    results: dict[str, tuple[np.ndarray, list[int]]] = {}
    errors: list[BaseException] = []
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg))

        def run(alias: str) -> None:
            try:
                results[alias] = golden_run(rt, pkg, alias, GenerationId(1))
            except BaseException as exc:  # re-raised in the main thread below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(m.alias,)) for m in pkg.models]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        counters = rt.counters()
        rt.reset_configuration()
    assert set(results) == set(pkg.aliases)
    for m in pkg.models:
        logits, tokens = results[m.alias]
        tol = m.golden.tolerance
        golden_logits = np.load(pkg.root / m.golden.prefill_logits.file)
        assert np.allclose(logits, golden_logits, rtol=tol.rtol, atol=tol.atol), m.alias
        top = np.argsort(-golden_logits[0])[: tol.top_k]
        assert list(np.argsort(-logits[0])[: tol.top_k]) == list(top), m.alias
        assert tokens == np.load(pkg.root / m.golden.decode_tokens.file).reshape(-1).tolist(), m.alias
    steps = {m.alias: int(np.prod(m.golden.decode_tokens.shape)) for m in pkg.models}
    by_chip = {c.chip: c for c in counters}
    for m in pkg.models:
        c = by_chip[m.target_chips[0]]
        assert (c.pending, c.failed, c.finished) == (0, 0, steps[m.alias])  # 1 prefill + steps-1 decodes
