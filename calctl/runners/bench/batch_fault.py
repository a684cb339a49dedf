"""Scenario ``batch``, its KV-fault phase: a fault in a batched decode job, and whether the engine recovers (000 §19 M3).

000 §19 M3 asks for "KV fault 可恢复" on a batched profile. What a KV fault is, and what recovering from it
means, 000 states for the batched case: a device-level failure fails the whole batch and marks all its lanes'
KV Unknown (§7.4, §9.2: "timeout/CCU fault 后 state=Unknown，不将 lane 分给其他请求"), and after a timeout or
a CCU fault all lanes recover consistently (§18, B4/8/16 column: "全 lanes 一致恢复"). So the phase, on the
**mock** board only (it arms the fault with ``MockRuntime.arm_fault``; a board needs the vendor's fault
injection, so on ``--device calrt`` the phase is not run and says so):

1. serves the package at the first batched profile (B4 when compiled), reads the KV it holds at rest
   (engine lanes by state, reserved/used tokens, jobs in flight or quarantined; the device's free KV
   sequences);
2. arms one ``ccu_exception`` on the :data:`FAULT_JOB`-th decode job from then on (the board's own fault
   plan may widen its ``reset_scope``), and sends ``2 x B`` greedy requests at once, so the job it hits
   carries several active lanes;
3. waits for the engine to recover (retire the generation, reset, golden + warm-up, Ready again);
4. sends ``B`` more requests, the "later" ones.

It **recovered** when: the fault fired in a decode job with more than one active lane; every request of
step 2 ended ``ok`` with the tokens the B1 reference gave the same prompt or ``device_error`` (the documented
end of a request whose job faulted or whose generation was retired: docs/serve.md), at least one of them
``device_error``; the model is Ready again after a recovery that succeeded; every later request ended ``ok``
with the B1 reference's tokens; and the KV is back where it was at rest (no lane Unknown or held, no
reserved or used token, nothing in flight or quarantined, as many free device KV sequences as before).
Anything else is not recovered, each failure named. A fault plan whose ``reset_failure`` breaks the reset
makes the phase not recovered (M3 NO-GO).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calctl.runners.bench.kv_at_rest import KvAtRest
from calctl.runners.device import DeviceSpec
from calctl.runners.serving_stack import ServingStack
from calctl.runners.traffic import ClientPlan, EngineResult, drive_engine_request
from calctl.runtime.interface import FaultInjecting
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import ResetScope
from calctl.serving.config import SchedulerConfig
from calctl.serving.engine import SupervisorOptions
from calctl.serving.outcomes import RequestOutcome
from calctl.serving.protocol import GenerationRequest
from calctl.signing.policy import TrustPolicy

Log = Callable[[str], None]

#: The decode job (1-based, counted from when the fault is armed) the CCU exception hits: by then the
#: ``2 x B`` requests have been prefilled and decode together, several lanes a job.
FAULT_JOB = 3
#: How long the phase waits for the engine to settle after the fault (reset, golden, warm-up on a loaded host).
SETTLE_TIMEOUT_S = 180.0
#: A client's pause before it retries a request refused with 503 while the model recovers.
RETRY_PAUSE_S = 0.1
#: Why the phase does not run on a board without fault injection, and what would measure it there.
NOT_ON_BOARD = (
    "KV-fault recovery on a batched profile needs fault injection, which only the mock board has "
    "(--device calrt cannot arm a fault)"
)
HOW_ON_BOARD = (
    "inject a CCU fault or a timeout into a B4+ decode job with the vendor's tools while `calctl serve` serves, "
    "then check the lanes' requests end device_error, later requests are served and the KV is back to rest"
)


@dataclass
class KvFaultPhase:
    """The phase's evidence (``kv_fault`` in the batch report); ``measured`` False: not run, ``reason`` why."""

    measured: bool
    profile: str = ""
    reason: str = ""
    how_to_measure: str = ""
    injected: str = ""
    fired: list[dict[str, Any]] = field(default_factory=list)
    faulted_lanes: int | None = None
    during: dict[str, int] = field(default_factory=dict)  # outcomes of the 2 x B requests
    device_errors: list[str] = field(default_factory=list)
    retried_503: int = 0  # requests refused with 503 while the model recovered, then served on a retry
    later: dict[str, int] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    ready_after: bool | None = None
    kv_before: dict[str, Any] | None = None
    kv_after: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def recovered(self) -> bool | None:
        return None if not self.measured else not self.problems

    def summary(self) -> str:
        if not self.measured:
            return f"not measured: {self.reason}"
        what = (
            f"{self.injected}: {self.faulted_lanes or 0} lane(s) of the faulted job, "
            f"{len(self.device_errors)} request(s) ended device_error, {self.during.get('ok', 0)} ok "
            f"({self.retried_503} retried after a 503 while it recovered); "
            f"later {self.later.get('ok', 0)}/{sum(self.later.values())} ok"
        )
        if self.problems:
            return f"NOT recovered ({what}): " + "; ".join(self.problems[:4])
        how = ", ".join(f"{r.get('scope')} reset in {float(r.get('seconds') or 0):.2f} s" for r in self.recoveries)
        return f"recovered ({what}; recovery: {how or 'none recorded'}; tokens as at B1, KV back to rest)"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "recovered": self.recovered, "summary": self.summary()}


def not_measured(reason: str, how: str) -> KvFaultPhase:
    return KvFaultPhase(False, reason=reason, how_to_measure=how)


@dataclass
class Served:
    """One request of the phase as its client saw it: the last attempt, after retries of a 503."""

    request_id: str
    result: EngineResult
    retries: int = 0

    @property
    def outcome(self) -> RequestOutcome:
        return self.result.record.outcome


async def _client(stack: ServingStack, req: GenerationRequest, timeout_s: float) -> Served:
    """A client as docs/serve.md asks: a 503 ``unavailable`` before the first token (the model recovering) is
    retried after a pause, until :data:`SETTLE_TIMEOUT_S` has passed or the model is Failed (a Failed alias
    waits for an operator, it never recovers by itself: docs/serve.md); any other end is the request's end."""
    end = time.monotonic() + SETTLE_TIMEOUT_S
    retries = 0
    while True:
        attempt = req if not retries else replace(req, request_id=f"{req.request_id}-retry{retries}")
        res = await drive_engine_request(
            stack.engine.submit, attempt, ClientPlan("batch-kv-fault"), timeout_s=timeout_s
        )
        rec = res.record
        gone = _given_up(stack, req.alias) or time.monotonic() > end
        if rec.outcome is not RequestOutcome.UNAVAILABLE or rec.tokens or gone:
            return Served(req.request_id, res, retries)
        retries += 1
        await asyncio.sleep(RETRY_PAUSE_S)


def _given_up(stack: ServingStack, alias: str) -> bool:
    """The model will not be served again without an operator: Failed, or a recovery of it failed."""
    return stack.core(alias).failed is not None or any(not r.ok for r in stack.sup.recoveries)


def _settle(stack: ServingStack, alias: str) -> bool:
    """Until the engine settled after the fault (True), a recovery failed or :data:`SETTLE_TIMEOUT_S` passed."""
    end = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < end and not _given_up(stack, alias):
        if stack.settled():
            return True
        time.sleep(0.02)
    return stack.settled()


async def _send(stack: ServingStack, requests: Sequence[GenerationRequest], timeout_s: float) -> list[Served]:
    return list(await asyncio.gather(*(_client(stack, r, timeout_s) for r in requests)))


def _outcomes(results: Sequence[Served]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        out[r.outcome.value] = out.get(r.outcome.value, 0) + 1
    return out


def _scope(rt: Any) -> ResetScope:
    """How far a CCU fault reaches on this board: the reset scope its own fault plan declares, else chip."""
    for rule in rt.fault_rules():
        if rule.kind is FaultKind.CCU_EXCEPTION:
            return ResetScope(rule.reset_scope)
    return ResetScope.CHIP


class _IntendedEnds(logging.Filter):
    """The engine's warning for each request of the phase that the injected fault ended: intended, and said
    once by the phase's own summary line, not once a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "request kvfault-" not in record.getMessage()


@contextlib.contextmanager
def _quiet_intended_ends() -> Iterator[None]:
    logger = logging.getLogger("calctl.serve")
    quiet = _IntendedEnds()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def run_kv_fault(
    *,
    package: Path,
    trust: TrustPolicy,
    device: DeviceSpec,
    alias: str,
    batch: int,
    config: SchedulerConfig,
    prompts: Sequence[GenerationRequest],
    reference: Mapping[str, list[int]],
    timeout_s: float,
    log: Log,
) -> KvFaultPhase:
    """The phase at profile B``batch``: ``prompts`` are reference requests (their B1 tokens in ``reference``)."""
    if not device.is_mock:
        return not_measured(NOT_ON_BOARD, HOW_ON_BOARD)
    t0 = time.monotonic()
    ph = KvFaultPhase(True, profile=f"B{batch}")
    during = [replace(p, request_id=f"kvfault-{i}") for i, p in enumerate(prompts[: 2 * batch])]
    later = [replace(p, request_id=f"kvfault-later-{i}") for i, p in enumerate(prompts[:batch])]
    source = {r.request_id: p.request_id for r, p in zip(during, prompts, strict=False)}
    source.update({r.request_id: p.request_id for r, p in zip(later, prompts, strict=False)})
    with _quiet_intended_ends(), device.open() as rt:
        if not isinstance(rt, FaultInjecting):  # the mock always injects; a new device kind must say so
            return not_measured(NOT_ON_BOARD, HOW_ON_BOARD)
        with ServingStack(
            rt,
            trust=trust,
            name=f"batch-kv-fault-b{batch}",
            scheduler_configs={alias: config},
            options=SupervisorOptions(warmup_iterations=1),
        ) as stack:
            stack.start(package)
            core = stack.core(alias)
            graph = core.model.decode.name
            before = KvAtRest.read(stack, alias)
            ph.kv_before = before.to_dict()
            scope = _scope(rt)
            seen = len(rt.injected_faults())
            rt.arm_fault(FaultRule(FaultKind.CCU_EXCEPTION, at=(FAULT_JOB,), graph=graph, reset_scope=scope))
            ph.injected = (
                f"ccu_exception on decode job {FAULT_JOB} of {graph} at B{batch} (the fault's reach: {scope.value})"
            )
            log(f"  KV fault at B{batch}: {ph.injected}, {len(during)} requests at once")
            first = stack.loop.submit(_send(stack, during, timeout_s)).result(SETTLE_TIMEOUT_S + timeout_s + 30)
            settled = _settle(stack, alias)
            fired = [f for f in rt.injected_faults()[seen:] if f.kind is FaultKind.CCU_EXCEPTION]
            ph.fired = [{"job": f.job, "graph": f.graph, "chips": list(f.chips)} for f in fired]
            ph.recoveries = [
                {k: r[k] for k in ("reason", "scope", "ok", "seconds", "detail") if k in r}
                for r in stack.sup.isolation_evidence()
            ]
            ph.ready_after = core.is_ready()
            second = stack.loop.submit(_send(stack, later, timeout_s)).result(timeout_s + 30) if ph.ready_after else []
            if ph.ready_after:
                stack.wait_settled(30.0)
            after = KvAtRest.read(stack, alias)
            ph.kv_after = after.to_dict()
            ph.faulted_lanes = _lanes_of(first) if fired else None
    ph.during, ph.later = _outcomes(first), _outcomes(second)
    ph.device_errors = [r.request_id for r in first if r.outcome is RequestOutcome.DEVICE_ERROR]
    ph.retried_503 = sum(1 for r in first if r.retries)
    for r in [*first, *second]:
        if r.result.record.ok and list(r.result.token_ids) != list(reference.get(source[r.request_id], [])):
            ph.mismatches.append(f"{r.request_id}: tokens differ from the B1 reference's for the same prompt")
    ph.problems = _problems(ph, first, second, settled, after.problems_against(before, since="the fault"))
    ph.seconds = round(time.monotonic() - t0, 3)
    return ph


def _lanes_of(first: Sequence[Served]) -> int:
    """The lanes of the faulted job: its requests end device_error naming the job's fault (000 §7.4: the whole
    batch fails); the others the recovery took end device_error naming the retired generation."""
    return sum(
        1 for r in first if r.outcome is RequestOutcome.DEVICE_ERROR and "retired" not in (r.result.record.error or "")
    )


def failed_recovery(ph: KvFaultPhase) -> list[dict[str, Any]]:
    return [r for r in ph.recoveries if not r.get("ok")]


#: How a request of the faulted batch may end: served, or the documented device_error (its job faulted, or the
#: recovery retired its generation under it; docs/serve.md). A 503 is retried by the client until served.
_ENDS = (RequestOutcome.OK, RequestOutcome.DEVICE_ERROR)


def _problems(
    ph: KvFaultPhase, first: Sequence[Served], second: Sequence[Served], settled: bool, kv: list[str]
) -> list[str]:
    problems: list[str] = []
    if not ph.fired:
        problems.append("the fault did not fire: no batched decode job reached it")
    elif (ph.faulted_lanes or 0) < 2:
        problems.append(f"the faulted job carried {ph.faulted_lanes or 0} active lane(s): not a batched fault")
    odd = [f"{r.request_id} {r.outcome.value}" for r in first if r.outcome not in _ENDS]
    if odd:
        problems.append(
            f"requests ended other than ok or device_error (503s retried until served): {', '.join(odd[:5])}"
        )
    if not settled and not failed_recovery(ph):
        problems.append(f"the engine did not settle within {SETTLE_TIMEOUT_S:g} s of the fault")
    failed = failed_recovery(ph)
    if failed:
        problems.append(f"recovery failed: {failed[0].get('detail') or failed[0].get('reason')}")
    elif ph.fired and not ph.recoveries:
        problems.append("no recovery was recorded after the fault")
    if not ph.ready_after:
        problems.append("the model is not Ready after the fault (no later request could be served)")
    bad_later = [f"{r.request_id} {r.outcome.value}" for r in second if r.outcome is not RequestOutcome.OK]
    if bad_later:
        problems.append(f"later requests not served: {', '.join(bad_later[:5])}")
    problems += ph.mismatches[:5]
    if ph.ready_after:
        problems += [f"KV not back to rest: {p}" for p in kv]
    return problems


__all__ = [
    "FAULT_JOB",
    "HOW_ON_BOARD",
    "NOT_ON_BOARD",
    "KvFaultPhase",
    "not_measured",
    "run_kv_fault",
]
