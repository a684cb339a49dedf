"""Checks of what the board computes: deterministic outputs, the package's golden data."""

from __future__ import annotations

import math

import numpy as np

from calctl.model import decoder
from calctl.package import npy
from calctl.runtime import Runtime
from calctl.runtime.conformance.framework import (
    ExpectationFailed,
    Session,
    check,
    decode_mask,
    expect,
    golden_prompt,
    prefill_job,
    write_decode,
)


@check("deterministic_outputs", "outputs are a deterministic function of the inputs", clauses=("COMPUTE-1",))
def _deterministic(s: Session) -> str:
    pkg = s.package
    alias = pkg.models[0].alias
    prompt = golden_prompt(pkg, alias)
    with s.configured() as rt:
        outs = []
        for p in (prompt, prompt, prompt[::-1].copy()):
            job, seq, _, outputs = prefill_job(rt, pkg, alias, p)
            rt.wait(job, 10)
            outs.append(outputs.read("logits").copy())
            rt.kv.free(seq)
    expect(bool(np.array_equal(outs[0], outs[1])), "the same prompt gives the same logits", returned=None)
    expect(not np.allclose(outs[0], outs[2]), "a different prompt gives different logits", returned=None)
    return "same inputs, same logits; other inputs, other logits"


@check(
    "golden_compute",
    "the package's golden data: prefill logits within tolerance, greedy decode tokens exact; a prefill of the whole "
    "context equals the package's float64 model",
    clauses=("COMPUTE-1", "COMPUTE-2"),
)
def _golden(s: Session) -> str:
    pkg = s.package
    with s.configured() as rt:
        for m in pkg.models:
            g, tol = m.golden, m.golden.tolerance
            prompt = golden_prompt(pkg, m.alias)
            want = npy.load(pkg.root / g.prefill_logits.file).astype(np.float32).reshape(1, -1)
            tokens = npy.load(pkg.root / g.decode_tokens.file).reshape(-1).astype(np.int64)
            job, seq, _, outputs = prefill_job(rt, pkg, m.alias, prompt)
            rt.wait(job, 30)
            got = outputs.read("logits").reshape(1, -1)
            close = np.isclose(got, want, rtol=tol.rtol, atol=tol.atol)
            if not close.all():
                idx = int(np.argmax(~close.reshape(-1)))
                raise ExpectationFailed(
                    f"graph {m.prefill.name!r}: logits[0, {idx}] = {got.reshape(-1)[idx]:.6g}, expected "
                    f"{want.reshape(-1)[idx]:.6g} (rtol {tol.rtol:g}, atol {tol.atol:g}); "
                    f"{int((~close).sum())} of {close.size} values outside, max |err| {float(np.abs(got - want).max()):.3g}",
                    call="calrt_job_submit / calrt_job_wait",
                    arguments=f"graph={m.prefill.name!r}, prompt of {len(prompt)} tokens",
                    returned=f"logits[0, {idx}] = {got.reshape(-1)[idx]:.6g}",
                )
            rt.kv.commit(seq)
            token, position = int(np.argmax(got[0])), len(prompt)
            for step, expected in enumerate(tokens):
                if token != int(expected):
                    raise ExpectationFailed(
                        f"graph {m.decode.name!r}: greedy token {step} (position {position}) is {token}, "
                        f"expected {int(expected)}",
                        call="calrt_job_submit / calrt_job_wait",
                        arguments=f"graph={m.decode.name!r}, position={position}",
                        returned=f"token {token}",
                    )
                if step == len(tokens) - 1:
                    break
                with rt.job_buffers(m.decode.name) as (inputs, outs):
                    rt.kv.append(seq, 1)
                    write_decode(inputs, token, position, mask=decode_mask(pkg, m.alias))
                    rt.wait(rt.submit(m.decode.name, inputs, outs, kv=[seq]), 30)
                    rt.kv.commit(seq)
                    token = int(np.argmax(outs.read("logits")[0]))
                position += 1
            rt.kv.free(seq)
        whole = [_whole_context(s, rt, mi) for mi in range(len(pkg.models))]
    exact = ", ".join(
        f"{m.alias}: logits within tolerance, "
        f"{len(npy.load(pkg.root / m.golden.decode_tokens.file).reshape(-1))} tokens exact"
        for m in pkg.models
    )
    return f"{exact}; {'; '.join(whole)}"


#: the float64 reference recomputes every position on the host: bounded so that a vendor's full-size model is not
#: judged this way (a note says so), while a test package's context is tried whole
HOST_REFERENCE_MAX_WEIGHTS = 16_000_000
HOST_REFERENCE_MAX_TOKENS = 1024


def _whole_context(s: Session, rt: Runtime, index: int) -> str:
    """COMPUTE-2: the golden prompt is short, so a fault past its positions (a rotary table of 128 entries, a score
    buffer sized for the default context) agrees with the golden data, and decodes agree with prefills since both
    share it. A prefill of seeded tokens over the whole context (the prefill graph's token count, at most the
    architecture's limit) is compared with ``calctl.model.decoder.reference_logits``, the package's own model in
    float64 over its parameters, within the golden tolerance."""
    pkg = s.package
    m = pkg.models[index]
    if not m.params:
        return f"{m.alias}: no parameters in the package, the whole context not judged"
    weights = sum(math.prod(t.shape) for t in m.params)
    if weights > HOST_REFERENCE_MAX_WEIGHTS:
        return (
            f"{m.alias}: {weights:,} weights, too many for the host's float64 reference: the whole context not judged"
        )
    vocab, max_tokens = int(m.prefill.output("logits").shape[-1]), int(m.prefill.input("tokens").shape[-1])
    end = min(max_tokens, int(m.architecture.context_limit), HOST_REFERENCE_MAX_TOKENS)
    tokens = np.random.default_rng([index, 0xC0DE]).integers(0, vocab, size=end).astype(np.int32)
    params = {k: np.asarray(v, np.float64) for k, v in decoder.load_params(pkg.root, m.params).items()}
    want = decoder.reference_logits(params, m.architecture, tokens, last_only=True)[0]
    job, seq, _, outputs = prefill_job(rt, pkg, m.alias, tokens)
    expect(rt.wait(job, 60).ok, f"a prefill of {end} tokens of {m.alias} succeeds", call="rt.wait")
    got = outputs.read("logits")[0].astype(np.float64)
    rt.kv.free(seq)
    tol = m.golden.tolerance
    close = np.isclose(got, want, rtol=tol.rtol, atol=tol.atol)
    if not close.all():
        idx = int(np.argmax(~close))
        raise ExpectationFailed(
            f"COMPUTE-2: graph {m.prefill.name!r}: a prefill of the whole context ({end} tokens) differs from the "
            f"package's model (float64 reference): logits[0, {idx}] = {got[idx]:.6g}, expected {want[idx]:.6g} "
            f"(rtol {tol.rtol:g}, atol {tol.atol:g}); {int((~close).sum())} of {close.size} values outside, max "
            f"|err| {float(np.abs(got - want).max()):.3g}",
            call="calrt_job_submit / calrt_job_wait",
            arguments=f"graph={m.prefill.name!r}, {end} seeded tokens",
            returned=f"logits[0, {idx}] = {got[idx]:.6g}",
        )
    return f"{m.alias}: a prefill of {end} tokens equals the float64 model (max |err| {np.abs(got - want).max():.2g})"
