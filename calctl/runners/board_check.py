"""``calctl device check`` and ``calctl device reset``: is the board ready, and did a reset bring it back.

A readiness answer a scheduler prologue, a Kubernetes probe or a lab's place check can trust (docs/deploy.md):

1. ``open device`` – the shim loads and its C ABI major matches (``open_runtime``), the board lock is taken
   (docs/calrt-c-abi.md §10); failing that there is no device here: ERROR, exit 3;
2. ``versions`` – runtime, driver, firmware, C ABI and what the device is (mock, software model, board);
3. ``topology`` – every chip of a Calculet board is there (two, 001 §2.1), with its CalCores and DRAM;
4. ``health chip N`` – what the runtime says of each chip;
5. ``known answer chip N`` – one model of the bundled combined sample per chip (model A on chip 0, model B
   on chip 1, SCHIP each, 001 §6.4), its golden prefill and greedy decode judged against the sealed golden
   data (``calctl.checks.golden``): the board computes, and computes right, on that chip;
6. ``health after`` – no known-answer job left a chip halted.

A chip is ready only when its known-answer job completed with the right answer (a validator that reports
Ready while a device node is missing, NVIDIA/gpu-operator#2685, is what this must never be): healthy
counters alone never make a chip ready, and a chip whose health the runtime cannot tell is ready on its
known answer alone (WARN, named). PASS (exit 0) ready; FAIL (exit 1) not ready, naming each chip and why.

``device reset`` opens the board the same way (a board another process holds is refused before anything is
reset: ERROR, exit 3), resets the chip or the board, then proves the board came back with steps 3–6. It
never passes after a reset that did not bring a chip back (tenstorrent/tt-umd#2316: a reset that exits 0
and leaves no device): a reset the runtime refused or failed is FAIL naming the chips it covered, and so is
any chip the proof finds down, whichever chip the reset was for (Xilinx/video-sdk#8).

This module opens, resets and judges; it does not pick the board (``calctl.runtime.selection``), parse
options or render.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.checks.golden import GoldenResult, run_golden_model
from calctl.checks.steps import StepTimedOut
from calctl.report import Report, StepStatus
from calctl.runners.context import RunContext
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Opening, Run, RunState, RunStep, drive
from calctl.runners.steps import RunOutcome, StepLog, StepNote
from calctl.runtime import Health, ResetScope, Runtime
from calctl.runtime.board_lock import BoardLocked
from calctl.runtime.errors import RuntimeLayerError

#: A Calculet board is one device of two chips (001 §2.1); a topology with fewer is missing a chip.
BOARD_CHIPS = 2


@dataclass
class ChipReadiness:
    """What the check found on one chip; ``why`` is None exactly when the chip is ready."""

    chip: int
    present: bool = True
    health: str | None = None
    health_detail: str | None = None
    model: str | None = None  # the known-answer model that ran on the chip
    known_answer: str = StepStatus.SKIP.value
    known_answer_detail: str | None = None
    why: str | None = None
    #: False: the chip is not ready only because another chip's fault stopped its proof (reported after).
    own_fault: bool = True

    def down(self, why: str, *, own_fault: bool = True) -> None:
        """The chip is not ready; the first reason found is the one reported."""
        if self.why is None:
            self.why, self.own_fault = why, own_fault

    def document(self) -> dict[str, Any]:
        return {
            "chip": self.chip,
            "ready": self.why is None,
            "why": self.why,
            "present": self.present,
            "health": self.health,
            "health_detail": self.health_detail,
            "known_answer": {"model": self.model, "status": self.known_answer, "detail": self.known_answer_detail},
        }


@dataclass
class BoardProof:
    """The per-chip findings of one check, and the board-level reasons (a failed reset)."""

    chips: dict[int, ChipReadiness] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def chip(self, c: int) -> ChipReadiness:
        return self.chips.setdefault(c, ChipReadiness(c))

    @property
    def ready(self) -> bool:
        return bool(self.chips) and not self.problems and all(s.why is None for s in self.chips.values())

    def reasons(self) -> list[str]:
        # The chips at fault first (the error's first words name the cause), then those it kept unproven.
        order = sorted(self.chips.values(), key=lambda s: (not s.own_fault, s.chip))
        down = [f"chip {s.chip}: {s.why}" for s in order if s.why]
        return [*self.problems, *down]


@dataclass(frozen=True)
class ResetRequest:
    """``--scope chip|board`` and ``--chip N`` (a chip reset names its chip; a board reset names none)."""

    scope: ResetScope
    chip: int | None = None

    def words(self) -> str:
        return "board reset" if self.scope is ResetScope.BOARD else f"chip {self.chip} reset"


def known_answer_package() -> Path:
    """The bundled combined sample: one SCHIP model per chip, sealed golden data (built on first use)."""
    from calctl.cache import cache_dir
    from calctl.compiler.bundled import bundled_package
    from calctl.errors import ConfigError

    try:
        return bundled_package("combined")
    except OSError as exc:  # a cache it cannot write: the user's to fix (exit 2), not a calctl bug
        raise ConfigError(
            f"the known-answer package cannot be built in the cache {cache_dir()}: {exc.strerror or exc}",
            hint="set CALCTL_CACHE_DIR to a writable directory, or build the cache once where it is (docs/deploy.md §8)",
        ) from None


def check_board(
    device: DeviceSpec,
    *,
    log: StepLog | None = None,
    step_timeout_s: float = 10.0,
    board: dict[str, Any] | None = None,
) -> Report:
    """``calctl device check``: the readiness of the board ``device`` opens (module docstring)."""
    return _run("device check", device, None, log or StepLog(), step_timeout_s, board)


def reset_board(
    device: DeviceSpec,
    request: ResetRequest,
    *,
    log: StepLog | None = None,
    step_timeout_s: float = 10.0,
    board: dict[str, Any] | None = None,
) -> Report:
    """``calctl device reset``: reset, then prove the board came back (module docstring)."""
    return _run("device reset", device, request, log or StepLog(), step_timeout_s, board)


def _run(
    command: str,
    device: DeviceSpec,
    request: ResetRequest | None,
    log: StepLog,
    step_timeout_s: float,
    board: dict[str, Any] | None,
) -> Report:
    from calctl.signing.policy import make_policy

    proof = BoardProof()
    steps = [
        RunStep("open device", lambda s, note: _open(s, request), logged=False),
        RunStep("versions", lambda s, note: _versions(s.rt, note)),
        *([] if request is None else [RunStep(request.words(), lambda s, n: _reset(s, request, proof), logged=False)]),
        RunStep("prove", lambda s, note: _prove(s, proof, step_timeout_s), logged=False),
    ]
    # The known answers are the bundled sample's, signed by the published test-only key: trusted for this.
    trust = make_policy(None, False, trust_test_key=True)
    run = Run(
        command,
        device,
        steps,
        lambda s, ended: _report(s, proof, request, ended, board),
        package=known_answer_package(),
        trust=trust,
        opening=Opening.CONTEXT,
    )
    return drive(run, log=log)


def _open(s: RunState, request: ResetRequest | None) -> Runtime:
    assert s.ctx is not None
    try:
        return s.ctx.open_device()
    except BoardLocked as exc:
        if request is None:
            raise
        # Nothing was reset: say so before anything else (the holder's jobs would die under a reset).
        raise BoardLocked(f"refused, nothing was reset: {exc.message}", hint=exc.hint) from None


def _versions(rt: Runtime, note: StepNote) -> None:
    v = rt.versions()
    what = "mock" if rt.kind.value == "mock" else ("software model" if v.software_model else "board")
    note.detail = f"C ABI {v.abi}, runtime {v.runtime}, driver {v.driver}, firmware {v.firmware} ({what})"


def _reset(s: RunState, request: ResetRequest, proof: BoardProof) -> None:
    """Reset as asked. A refusal or failure is a problem of the board, never a pass (tt-umd#2316)."""
    rt, log = s.rt, s.log
    chips = rt.topology().chips
    if request.scope is ResetScope.BOARD:
        covered = list(range(chips))
    elif request.chip is not None and 0 <= request.chip < chips:
        covered = [request.chip]
    else:
        from calctl.errors import UsageError

        raise UsageError(f"--chip {request.chip}: the board has chips 0..{chips - 1}")
    t0 = time.perf_counter()
    try:
        rt.reset(request.scope, request.chip)
    except RuntimeLayerError as exc:
        why = f"the {request.words()} failed: {exc.message}"
        for c in covered:  # whatever the proof finds after, these chips were not reset
            proof.chip(c).down(why)
        log.add(request.words(), StepStatus.FAIL, time.perf_counter() - t0, why)
        return
    log.add(request.words(), StepStatus.PASS, time.perf_counter() - t0, "the runtime returned OK; proving it")


def _prove(s: RunState, proof: BoardProof, step_timeout_s: float) -> None:
    """Topology, health, then a known-answer job on every chip, then health again."""
    ctx, rt, log = s.ctx, s.rt, s.log
    assert ctx is not None
    _topology(rt, proof, log)
    _health(rt, proof, log, "health chip")
    ctx.validate()  # the known answers' seal, whatever the chips say: the report names their digest
    down = sorted(c for c, s in proof.chips.items() if s.health not in (None, Health.OK.value, Health.UNKNOWN.value))
    missing = sorted(c for c, s in proof.chips.items() if not s.present)
    if down or missing:
        why = "; ".join(
            f"chip {', '.join(map(str, chips))} {what}"
            for chips, what in ((missing, "missing"), (down, "down"))
            if chips
        )
        for c in sorted(proof.chips):
            # 001 §2.4: configure is board-global, so one chip down leaves no calbin to run on the other.
            log.skip(f"known answer chip {c}", f"not run: {why}; configure is board-wide (001 §2.4)")
            proof.chip(c).down(f"no known-answer job ran: {why}", own_fault=False)
        return
    ctx.load()  # and the device fit: both chips are there
    calbin = ctx.create_calbin()
    ctx.configure()
    assert ctx.pkg is not None
    for c in sorted(proof.chips):
        models = [alias for alias, mp in calbin.plan.models.items() if c in mp.chips]
        _known_answer(rt, ctx, proof.chip(c), models, log, step_timeout_s)
    _health(rt, proof, log, "health after chip")


def _topology(rt: Runtime, proof: BoardProof, log: StepLog) -> None:
    with log.step("topology") as note:
        topo = rt.topology()
        for c in range(max(topo.chips, BOARD_CHIPS)):
            proof.chip(c).present = c < topo.chips
        missing = [c for c in range(topo.chips, BOARD_CHIPS)]
        dram = ", ".join("n/a" if d is None else f"{d / 2**30:.1f} GiB" for d in topo.dram_bytes)
        note.detail = f"{topo.chips} chips x {topo.calcores_per_chip} CalCores, DRAM {dram}"
        for c in missing:
            proof.chip(c).down(f"missing: the runtime reports {topo.chips} chip(s), a Calculet board has 2 (001 §2.1)")
        if missing:
            note.status = StepStatus.FAIL
            note.detail += f"; chip {', '.join(map(str, missing))} missing"


def _health(rt: Runtime, proof: BoardProof, log: StepLog, step: str) -> None:
    t0 = time.perf_counter()
    health = {h.chip: h for h in rt.health()}
    for c, state in sorted(proof.chips.items()):
        if not state.present:
            continue
        h = health.get(c)
        state.health = h.health.value if h is not None else None
        state.health_detail = h.detail if h is not None else "the runtime reported nothing for this chip"
        status, detail = StepStatus.PASS, "ok"
        if h is None or h.health is Health.UNKNOWN:
            # The runtime cannot tell: the known-answer job alone decides, and the row says so.
            status, detail = StepStatus.WARN, "unknown: the runtime cannot tell; the known-answer job decides"
        elif h.health is not Health.OK:
            status, detail = StepStatus.FAIL, f"{h.health.value}" + (f": {h.detail}" if h.detail else "")
            state.down(detail)
        log.add(f"{step} {c}", status, time.perf_counter() - t0, detail)


def _known_answer(
    rt: Runtime, ctx: RunContext, state: ChipReadiness, models: list[str], log: StepLog, step_timeout_s: float
) -> None:
    """One model whose graphs run on ``state.chip``: its golden run, judged. Any failure is the chip's."""
    name = f"known answer chip {state.chip}"
    assert ctx.pkg is not None
    if not models:
        state.down("no known-answer model runs on this chip")
        log.add(name, StepStatus.FAIL, 0.0, state.why or "")
        return
    state.model = models[0]
    t0 = time.perf_counter()
    result: GoldenResult | None = None
    try:
        result = run_golden_model(rt, ctx.pkg, state.model, step_timeout_s=step_timeout_s)
    except StepTimedOut as exc:
        # The chip hung: not ready. RunContext's drain resets the board, so the check leaves it usable.
        state.down(f"the known-answer job did not finish within {step_timeout_s:g} s ({exc.message})")
    except RuntimeLayerError as exc:
        state.down(f"the known-answer job failed: {exc.message}")
    else:
        if not result.ok:
            state.down(f"wrong answer: {result.reason}")
    seconds = time.perf_counter() - t0
    state.known_answer = StepStatus.PASS.value if state.why is None else StepStatus.FAIL.value
    state.known_answer_detail = _golden_detail(state.model, result) if state.why is None else state.why
    log.add(name, StepStatus(state.known_answer), seconds, state.known_answer_detail or "")


def _golden_detail(model: str, r: GoldenResult | None) -> str:
    if r is None:
        return model
    err = f"{r.prefill_max_abs_err:.2g}" if r.prefill_max_abs_err is not None else "n/a"
    return f"{model}: logits max |err| {err}, top-k agree, {len(r.got_tokens)}/{len(r.expected_tokens)} tokens exact"


def _report(
    s: RunState, proof: BoardProof, request: ResetRequest | None, ended: Ended, board: dict[str, Any] | None
) -> Report:
    error = ended.error
    if ended.outcome is RunOutcome.FAIL and error is not None:  # e.g. the bundled sample refused: not proven ready
        proof.problems.append(error)
    reasons = proof.reasons()
    if not ended.stopped:
        verdict = "PASS" if proof.ready else "FAIL"
        if verdict == "PASS" and any(c.health == Health.UNKNOWN.value for c in proof.chips.values()):
            verdict = "WARN"  # ready on the known answers alone; the rows name the chips
        error = None if proof.ready else "; ".join(reasons) or "no chip was checked"
    else:
        verdict = ended.outcome.value
    body: dict[str, Any] = {
        "ready": verdict in ("PASS", "WARN"),
        "board": board,
        "expected_chips": BOARD_CHIPS,
        "chips": [c.document() for c in sorted(proof.chips.values(), key=lambda c: c.chip)],
    }
    if request is not None:
        body["reset"] = {"scope": request.scope.value, "chip": request.chip}
    return s.report(verdict, body, error=error, reasons=reasons, events=True)


__all__ = [
    "BOARD_CHIPS",
    "BoardProof",
    "ChipReadiness",
    "ResetRequest",
    "check_board",
    "known_answer_package",
    "reset_board",
]
