"""The output checks a finished job passes before anything of it is trusted (000 §14): the runtime's answer about
the job must agree with itself and with what was submitted, and its logits must be something a model's forward
can give."""

from __future__ import annotations

import numpy as np

from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.types import Job, JobResult


def logits_fault(logits: np.ndarray) -> str | None:
    """Why a finished job's logits rows (one a lane) cannot be sampled, or None (000 §14 output checks).

    Non-finite values, or a degenerate row: every logit of a lane equal (all 0.0 the usual case). A model's
    forward does not give that; an output the device never wrote does, and so did a hidden state past what
    float32 can normalise before the decoder made it NaN (``calctl.model.decoder._final_norm``, issue #55).
    Sampled, such a row answers with token 0 (greedy) or uniform noise, and the request would end 200 with it.
    """
    if logits.size == 0 or logits.ndim == 0:
        return None
    vocab = int(logits.shape[-1])
    rows = logits.reshape(-1, vocab)
    lo, hi = rows.min(axis=1), rows.max(axis=1)  # a NaN anywhere in a row makes both NaN
    finite = np.isfinite(lo) & np.isfinite(hi)
    if (finite & (lo < hi)).all() or (vocab == 1 and finite.all()):
        return None  # the usual answer in two reductions: a step's host time is counted in microseconds
    if not finite.all():
        return "non-finite logits"
    lane = int(np.flatnonzero(lo == hi)[0])
    return f"degenerate logits (lane {lane}: every one of {vocab} equal to {float(lo[lane])!r})"


def status_anomaly(submitted: Job, res: JobResult) -> str | None:
    """What is self-contradictory in the runtime's answer about ``submitted``, a job Wait reported done (000 §14)."""
    if res.job.id != submitted.id:
        return f"query about job {submitted.id} answered for job {res.job.id}"
    # 000 §7.4: a finished job's generation and lanes must be the ones it was submitted with.
    if res.job.generation != submitted.generation:
        return (
            f"job {res.job.id} finished under generation {res.job.generation}, submitted under {submitted.generation}"
        )
    if tuple(res.job.kv) != tuple(submitted.kv) or res.job.batch != submitted.batch:
        return f"job {res.job.id} finished on KV lanes {res.job.kv}, submitted on {submitted.kv}"
    if (res.job.model, res.job.graph) != (submitted.model, submitted.graph):
        return f"job {res.job.id} finished as {res.job.model}/{res.job.graph}, submitted as {submitted.model}/{submitted.graph}"
    if not res.state.terminal:
        return f"job {res.job.id} was reported done but is {res.state.value}"
    if res.ok and res.status != RuntimeStatus.OK:
        return f"job {res.job.id} succeeded with status {res.status.name}"
    if res.start_ns is not None and res.end_ns is not None and res.end_ns < res.start_ns:
        return f"job {res.job.id} ended before it started"
    return None


__all__ = ["logits_fault", "status_anomaly"]
