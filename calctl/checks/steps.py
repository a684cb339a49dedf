"""One model's prefill + greedy decode on a device, step by step (001 §12 Phase 1, 000 §18 "单 seq prefill+decode").

Every runner (golden, warm-up, the combined PoC) and the serving engine's
load-time golden check drive the device the same way, so it lives here once:

* :class:`GoldenData` – a model's golden prompt, prefill logits, token sequence
  and tolerance, read from the package;
* :func:`greedy_run` – allocate a KV sequence, prefill the prompt, then decode
  greedily one token at a time, appending and committing KV around each job
  exactly as 000 §9.2 asks (reserve what the job writes, commit only after the
  device *and* the output succeeded), and free the sequence on every path;
* :class:`StepTimedOut` – a wait that exceeded the per-step deadline. Before it
  is raised the hung job is aborted with a reset of its own chip(s) when the
  runtime grants one (the configuration stays, the other chip is untouched);
  otherwise the caller's board reset (or closing the device) reclaims it.

Steps are named ``prefill`` and ``decode[k]`` (the k-th decode job, 0-based):
output token 0 comes from the prefill, output token ``i >= 1`` from
``decode[i-1]``, written at KV position ``len(prompt) + i - 1``.

This module does not judge results against the golden data (``golden.py``),
compute statistics (``stats.py``) or open devices (``context.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from calctl.errors import PackageError, StepTimeout
from calctl.package import npy
from calctl.package.model import Model, Package, Tolerance
from calctl.runtime import GenerationId, HostBuffer, Job, JobId, KvSeqId, ResetScope, Runtime
from calctl.runtime.errors import DeviceLost, NotSupported, RuntimeLayerError, Timeout

T = TypeVar("T")


@dataclass(frozen=True)
class GoldenData:
    """A model's golden data (docs/package-format.md ``<model>/golden/``), as the device runners use it."""

    alias: str
    prompt: tuple[int, ...]
    prefill_logits: np.ndarray = field(repr=False, compare=False)  # float32 [vocab]: logits after the last prompt token
    tokens: tuple[int, ...]  # greedy output tokens: tokens[0] from the prefill, tokens[i] from decode[i-1]
    tolerance: Tolerance

    @classmethod
    def load(cls, pkg: Package, alias: str) -> GoldenData:
        """Read the golden files of ``alias``; PackageError (exit 1) naming the file if one is unusable."""
        m = pkg.model(alias)
        g = m.golden
        prompt = _load_npy(pkg, g.prompt.file).reshape(-1)
        logits = _load_npy(pkg, g.prefill_logits.file).astype(np.float32, copy=False)
        tokens = _load_npy(pkg, g.decode_tokens.file).reshape(-1)
        vocab = m.architecture.vocab_size
        if prompt.size < 1 or tokens.size < 1:
            raise PackageError("golden prompt and token sequence must not be empty", path=g.prompt.file)
        if logits.size != vocab:
            raise PackageError(
                f"golden prefill logits hold {logits.size} values, the vocabulary has {vocab}",
                path=g.prefill_logits.file,
            )
        return cls(
            alias=alias,
            prompt=tuple(int(t) for t in prompt),
            prefill_logits=logits.reshape(vocab),
            tokens=tuple(int(t) for t in tokens),
            tolerance=g.tolerance,
        )


def _load_npy(pkg: Package, rel: str) -> np.ndarray:
    return npy.load_member(pkg.root, rel, what=" golden data")


def step_name(token_index: int) -> str:
    """The step that produced output token ``token_index``: ``prefill`` or ``decode[k]``."""
    return "prefill" if token_index == 0 else f"decode[{token_index - 1}]"


@dataclass(frozen=True)
class StepTiming:
    """One job as the host saw it: submit until ``wait`` returned (what a serving caller waits)."""

    step: str
    graph: str
    job: JobId
    seconds: float
    device_seconds: float | None  # from the runtime's own start/end stamps; None if it cannot tell


@dataclass
class GreedyProgress:
    """What a :func:`greedy_run` has done so far.

    The one mutable record in the runners: the caller owns it and reads it after
    an exception too, so a timeout or a device error still leaves its evidence
    (the steps that completed, the tokens produced).
    """

    alias: str
    prefill_logits: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    timings: list[StepTiming] = field(default_factory=list)
    current_step: str | None = None  # the step in flight when the run stopped, if it stopped early


@dataclass(frozen=True)
class JobBuffers:
    """A model's own prefill and decode buffers, reused job after job (001 §6.4 "independent A/B buffers")."""

    prefill_inputs: HostBuffer
    prefill_outputs: HostBuffer
    decode_inputs: HostBuffer
    decode_outputs: HostBuffer

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.prefill_inputs.id, self.prefill_outputs.id, self.decode_inputs.id, self.decode_outputs.id)


class StepTimedOut(StepTimeout):
    """A step's ``wait`` exceeded the per-step deadline (exit 4).

    ``recovery`` says what was done about the hung job. ``partial`` is set by the
    runner that caught it (e.g. the GoldenResult of the steps before the hang).
    """

    def __init__(self, *, alias: str, step: str, job: Job, timeout_s: float, recovery: str) -> None:
        chips = ", ".join(str(c) for c in job.chips)
        super().__init__(
            f"{alias}: {step} ({job.graph}, job {job.id} on chip {chips}) did not finish within {timeout_s:g} s; {recovery}",
            hint="a hang is a device fault (001 §11.3): the chip needs a reset, then golden + warm-up again before Ready "
            "(001 §13.3); raise --step-timeout only if the step is known to be slow",
        )
        self.alias = alias
        self.step = step
        self.job = job
        self.timeout_s = timeout_s
        self.recovery = recovery
        self.partial: Any = None


def abort_hung(rt: Runtime, job: Job) -> str:
    """Abort a job that will not finish, with the narrowest reset the runtime grants. Returns what happened.

    A chip reset of the job's chip(s) keeps the configuration and leaves the
    other chip alone (F2 on the mock, 001 §13.4). When the runtime has no chip
    reset (0.7.6 publicly offers only the board one) or the fault needs a wider
    scope, nothing is reset here: the caller's board reset or closing the
    device reclaims the job, its buffers and its KV.
    """
    done: list[str] = []
    for chip in job.chips:
        try:
            rt.reset(ResetScope.CHIP, chip=chip)
            done.append(str(chip))
        except (NotSupported, DeviceLost) as exc:
            return f"no chip reset possible ({exc.message}); the board needs a reset"
        except RuntimeLayerError as exc:
            return f"chip reset of chip {chip} failed ({exc.message}); the board needs a reset"
    return f"the hung job was aborted by a chip reset of chip {', '.join(done)}"


def _wait(
    rt: Runtime, job: Job, step: str, alias: str, timeout_s: float, t_submit: float, progress: GreedyProgress
) -> None:
    try:
        result = rt.wait(job, timeout_s)
    except Timeout:
        raise StepTimedOut(alias=alias, step=step, job=job, timeout_s=timeout_s, recovery=abort_hung(rt, job)) from None
    progress.timings.append(
        StepTiming(
            step=step,
            graph=job.graph,
            job=job.id,
            seconds=time.perf_counter() - t_submit,
            device_seconds=result.device_seconds,
        )
    )


def greedy_run(
    rt: Runtime,
    model: Model,
    prompt: tuple[int, ...],
    n_tokens: int,
    *,
    progress: GreedyProgress,
    generation: GenerationId = GenerationId(0),
    step_timeout_s: float = 30.0,
    buffers: JobBuffers | None = None,
) -> GreedyProgress:
    """Prefill ``prompt`` on ``model``'s prefill graph, then greedy-decode until ``n_tokens`` output tokens exist.

    Uses ``buffers`` when given (they must be idle), else fresh per-run buffers
    released on exit. The KV sequence is rolled back and freed on every path; a
    cleanup failure is raised only when nothing else is being raised.
    """
    if n_tokens < 1:
        raise ValueError("n_tokens must be >= 1")
    alias = model.alias
    seq = rt.kv.allocate(alias)
    ran = False
    try:
        if buffers is not None:
            _run_steps(rt, model, prompt, n_tokens, seq, buffers, progress, generation, step_timeout_s)
        else:
            with rt.job_buffers(model.prefill.name) as (pi, po), rt.job_buffers(model.decode.name) as (di, do):
                _run_steps(
                    rt, model, prompt, n_tokens, seq, JobBuffers(pi, po, di, do), progress, generation, step_timeout_s
                )
        ran = True
    finally:
        if not ran:  # an error or a signal is on its way: free what is freeable, never mask it
            free_quietly(rt, seq)
    rt.kv.free(seq)
    return progress


def free_quietly(rt: Runtime, seq: KvSeqId) -> None:
    """Best effort on an error path: a sequence a hung job still holds is reclaimed by the reset that aborts it."""
    try:
        length = rt.kv.length(seq)
        if length.reserved > length.committed:
            rt.kv.rollback(seq)
        rt.kv.free(seq)
    except RuntimeLayerError:
        pass


def _run_steps(
    rt: Runtime,
    model: Model,
    prompt: tuple[int, ...],
    n_tokens: int,
    seq: KvSeqId,
    bufs: JobBuffers,
    progress: GreedyProgress,
    generation: GenerationId,
    timeout_s: float,
) -> None:
    alias = model.alias
    prefill, decode = model.prefill, model.decode
    pi, po = bufs.prefill_inputs, bufs.prefill_outputs
    capacity = pi.layout.slot("tokens").shape[1]
    if not 1 <= len(prompt) <= capacity:
        raise ValueError(f"{alias}: prompt of {len(prompt)} tokens does not fit the prefill graph's {capacity}")
    if len(prompt) + n_tokens - 1 > decode.max_seq:
        raise ValueError(
            f"{alias}: {len(prompt)} prompt + {n_tokens - 1} decoded tokens exceed max_seq {decode.max_seq}"
        )

    # Prefill: the whole prompt, padded to the graph's static shape; n_tokens is the CSR valid length.
    progress.current_step = "prefill"
    tokens = np.zeros(pi.layout.slot("tokens").shape, np.int32)
    tokens[0, : len(prompt)] = prompt
    pi.write("tokens", tokens)
    pi.write("n_tokens", np.array([len(prompt)], np.int32))
    rt.kv.append(seq, len(prompt))
    t0 = time.perf_counter()
    job = rt.submit(prefill.name, pi, po, kv=[seq], generation=generation)
    _wait(rt, job, "prefill", alias, timeout_s, t0, progress)
    rt.kv.commit(seq)  # 000 §9.2 rule 5: only after the device succeeded
    logits = po.read("logits")[0]
    progress.prefill_logits = logits
    progress.tokens.append(int(np.argmax(logits)))

    di, do = bufs.decode_inputs, bufs.decode_outputs
    pol = decode.inactive_lane_policy
    if pol is not None and pol.mask_input in di.names:
        di.write(
            pol.mask_input, np.ones(di.batch, np.uint8)
        )  # B1 on a B>1-capable graph: the one lane is active (000 §7.3)
    while len(progress.tokens) < n_tokens:
        step = f"decode[{len(progress.tokens) - 1}]"
        progress.current_step = step
        position = rt.kv.append(seq, 1)
        di.write("tokens", np.array([[progress.tokens[-1]]], np.int32))
        di.write("positions", np.array([position], np.int32))
        t0 = time.perf_counter()
        job = rt.submit(decode.name, di, do, kv=[seq], generation=generation)
        _wait(rt, job, step, alias, timeout_s, t0, progress)
        rt.kv.commit(seq)
        progress.tokens.append(int(np.argmax(do.read("logits")[0])))
    progress.current_step = None


def at_once(work: Callable[[str], T], aliases: Sequence[str], *, name: str) -> dict[str, T]:
    """``work(alias)`` for every alias at once, one thread each (001 §6.4: A and B on their own chips in
    parallel); the first exception a thread raised is raised here, after every thread ended."""
    results: dict[str, T] = {}
    errors: list[Exception] = []

    def one(alias: str) -> None:
        try:
            results[alias] = work(alias)
        except Exception as exc:  # re-raised in the caller's thread below (a signal reaches the main thread only)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(a,), name=f"{name}-{a}") for a in aliases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


__all__ = [
    "GoldenData",
    "GreedyProgress",
    "JobBuffers",
    "StepTimedOut",
    "StepTiming",
    "abort_hung",
    "at_once",
    "free_quietly",
    "greedy_run",
    "step_name",
]
