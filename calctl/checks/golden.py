"""Golden correctness of one model on a device (001 §12 Phase 1, §13.1 "单模型 golden"; 000 §18).

:func:`run_golden_model` runs the model's golden prompt through prefill and
greedy decode on an already configured runtime and judges three things against
the package's golden data, each with the tolerance the package declares:

* the prefill logits, ``allclose`` with the package's rtol/atol;
* top-k agreement: the same set of k highest logits (k from the package);
* the exact output token sequence.

The first failure, in step order, becomes the result's ``reason``: it names the
model, the step (``prefill`` or ``decode[k]``) and the position (vocabulary
index for logits, output token index and KV position for tokens).

Both the serving engine (golden before Ready, 001 §11.1) and ``calctl
run-golden`` (``calctl.runners.golden``) call it, which is why it lives below
both. This module does not print, write files or configure the device.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.checks.steps import GoldenData, GreedyProgress, StepTimedOut, greedy_run, step_name
from calctl.package.model import Package
from calctl.runtime import GenerationId, Runtime


@dataclass(frozen=True)
class GoldenResult:
    """One model's golden verdict. ``reason`` names model, step and position of the first failure."""

    alias: str
    ok: bool
    reason: str | None
    prefill_allclose: bool
    prefill_max_abs_err: float | None
    topk_agree: bool | None
    expected_tokens: tuple[int, ...]
    got_tokens: tuple[int, ...]
    first_mismatch: int | None  # index into the output tokens
    seconds: float
    # Every decode profile B > 1 against its B1 twins (calctl.checks.batch_golden), where the caller ran them.
    batch: tuple[Any, ...] = ()


@dataclass(frozen=True)
class LogitCheck:
    allclose: bool
    max_abs_err: float
    worst_index: int  # vocabulary index of the largest violation of |got - want| <= atol + rtol * |want|
    topk_agree: bool
    got_topk: tuple[int, ...]
    want_topk: tuple[int, ...]


def check_logits(got: np.ndarray, want: np.ndarray, *, rtol: float, atol: float, top_k: int) -> LogitCheck:
    """Compare one logit vector with the golden one (numpy ``allclose`` semantics, top-k as a set)."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return LogitCheck(False, float("inf"), 0, False, (), ())
    err = np.abs(got - want)
    excess = err - (atol + rtol * np.abs(want))
    worst = int(np.argmax(excess))
    k = max(1, min(top_k, got.size))
    got_top = tuple(int(i) for i in np.argsort(-got, kind="stable")[:k])
    want_top = tuple(int(i) for i in np.argsort(-want, kind="stable")[:k])
    # A set, not an order: ties at the k-th place may swap; the order of the top-1 is checked by the tokens.
    return LogitCheck(
        allclose=bool(np.all(np.isfinite(got)) and np.all(excess <= 0)),
        max_abs_err=float(np.max(err)) if np.all(np.isfinite(err)) else float("inf"),
        worst_index=worst,
        topk_agree=set(got_top) == set(want_top),
        got_topk=got_top,
        want_topk=want_top,
    )


def first_mismatch(expected: tuple[int, ...], got: tuple[int, ...]) -> int | None:
    """Index of the first differing output token; a short ``got`` mismatches where it ends."""
    for i, want in enumerate(expected):
        if i >= len(got) or got[i] != want:
            return i
    return None


def judge(golden: GoldenData, progress: GreedyProgress, seconds: float) -> GoldenResult:
    """The :class:`GoldenResult` of what ``progress`` holds against ``golden``."""
    tol = golden.tolerance
    alias = golden.alias
    n_prompt = len(golden.prompt)
    got = tuple(progress.tokens)
    mismatch = first_mismatch(golden.tokens, got)
    reasons: list[str] = []
    allclose, max_err, topk = False, None, None
    if progress.prefill_logits is None:
        reasons.append(f"{alias}: prefill: no logits (the step did not complete)")
    else:
        chk = check_logits(
            progress.prefill_logits, golden.prefill_logits, rtol=tol.rtol, atol=tol.atol, top_k=tol.top_k
        )
        allclose, max_err, topk = chk.allclose, chk.max_abs_err, chk.topk_agree
        if not chk.allclose:
            reasons.append(
                f"{alias}: prefill: logits outside rtol={tol.rtol:g}, atol={tol.atol:g} of golden at prompt position "
                f"{n_prompt - 1}, vocab index {chk.worst_index} (max |err| {chk.max_abs_err:.4g})"
            )
        if not chk.topk_agree:
            reasons.append(
                f"{alias}: prefill: top-{tol.top_k} disagree at prompt position {n_prompt - 1}: got {list(chk.got_topk)}, "
                f"golden {list(chk.want_topk)}"
            )
    if mismatch is not None and progress.prefill_logits is not None:
        step = step_name(mismatch)
        kv_pos = f", KV position {n_prompt + mismatch - 1}" if mismatch else ""
        if mismatch < len(got):
            reasons.append(
                f"{alias}: {step}: output token {mismatch}{kv_pos}: expected {golden.tokens[mismatch]}, got {got[mismatch]}"
            )
        else:
            reasons.append(f"{alias}: {step}: output token {mismatch}{kv_pos} was never produced")
    return GoldenResult(
        alias=alias,
        ok=not reasons,
        reason=reasons[0] if reasons else None,
        prefill_allclose=allclose,
        prefill_max_abs_err=max_err,
        topk_agree=topk,
        expected_tokens=golden.tokens,
        got_tokens=got,
        first_mismatch=mismatch,
        seconds=seconds,
    )


def run_golden_model(
    rt: Runtime,
    pkg: Package,
    alias: str,
    *,
    generation: GenerationId = GenerationId(0),
    step_timeout_s: float = 30.0,
) -> GoldenResult:
    """Run ``alias``'s golden prompt on ``rt`` (``pkg`` must be configured there) and judge it.

    Raises :class:`calctl.checks.steps.StepTimedOut` (a :class:`calctl.errors.StepTimeout`,
    exit 4) when a wait exceeds ``step_timeout_s``; its ``partial`` is the GoldenResult of
    the steps that completed, its ``recovery`` what was done about the hung job. Any other
    DeviceError propagates. The KV sequence and buffers are freed on every path.
    """
    golden = GoldenData.load(pkg, alias)
    model = pkg.model(alias)
    progress = GreedyProgress(alias)
    t0 = time.perf_counter()
    try:
        greedy_run(
            rt,
            model,
            golden.prompt,
            len(golden.tokens),
            progress=progress,
            generation=generation,
            step_timeout_s=step_timeout_s,
        )
    except StepTimedOut as exc:
        partial = judge(golden, progress, time.perf_counter() - t0)
        exc.partial = dataclasses.replace(partial, ok=False, reason=str(exc))
        raise
    return judge(golden, progress, time.perf_counter() - t0)


__all__ = ["GoldenResult", "LogitCheck", "check_logits", "first_mismatch", "judge", "run_golden_model"]
