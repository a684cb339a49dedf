"""Executor vocabulary of an engine core: modes, the ping/pong banks, downgrade records (000 §14, §15; 001 §9.3).

An engine core drives its chip in one of three modes (:class:`ExecutorMode`, set by
``executor.mode`` in the scheduler configuration):

* ``sync``: submit a job, then wait for it inline; nothing else overlaps. The
  baseline every other mode is measured against (000 §19 M1).
* ``async``: one job in flight, completed by a completion thread, so
  submission never blocks on a wait.
* ``pingpong``: two jobs in flight on alternating ``ping``/``pong`` banks
  (``executor.max_inflight: 2``). Ping/pong is an engine/bank choice, not
  batching: each job is its own batch with its own lanes. Two in flight does
  not mean two computing; only the trace shows what overlapped.

:class:`BankSlots` holds the job on each bank and refuses a second job that
would share anything with the first: input/output buffers, their backing
storage, KV sequences (the job's KV transaction) or requests (000 §14: "两个
batch 必须各有独立 InputBuf/OutputBuf/backing storage 和 KV transaction").

This module decides nothing about *when* to leave ping/pong; the downgrade
conditions live in :mod:`calctl.serving.engine.monitor`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from calctl.runtime.buffers import HostBuffer
from calctl.runtime.types import Engine, KvSeqId
from calctl.serving.config import ExecutorMode
from calctl.serving.core.ids import JobId, RequestId

BANKS = (Engine.PING, Engine.PONG)


class DowngradeReason(str, enum.Enum):
    """Why an engine core left ping/pong (000 §14). The values are the ``reason`` label of
    ``calctl_executor_downgrades_total``: a fixed set, so the label stays bounded."""

    OUTPUT_CROSSTALK = "output_crosstalk"  # non-finite logits, a result for a request not in the job, shared slot state
    STATUS_ANOMALY = "status_anomaly"  # the runtime's answer about a job contradicts itself
    COUNTER_ANOMALY = "counter_anomaly"  # chip counters went backwards, or pending does not close
    P99_REGRESSION = "p99_regression"  # inter-token P99 beyond the configured threshold over the baseline
    CONSECUTIVE_BUSY = "consecutive_busy"  # DeviceBusy N times in a row at submit
    CONSECUTIVE_TIMEOUTS = "consecutive_timeouts"  # Wait timed out N times in a row
    UNCERTAIN_RECOVERY = "uncertain_recovery"  # a fault needing recovery while two jobs shared the chip


@dataclass(frozen=True)
class DowngradeRecord:
    """One automatic mode change away from ping/pong: the log/status evidence behind the metric."""

    at: float  # wall-clock seconds (time.time()), for people reading the status
    from_mode: ExecutorMode
    to_mode: ExecutorMode
    reason: DowngradeReason
    detail: str
    draining_jobs: int  # jobs in flight that were left to drain

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "from": self.from_mode.value,
            "to": self.to_mode.value,
            "reason": self.reason.value,
            "detail": self.detail,
            "draining_jobs": self.draining_jobs,
        }


@dataclass(frozen=True)
class OperatorModeChange:
    """One mode an operator set through the executor endpoint (000 §14: the only way back to ping/pong)."""

    at: float  # wall-clock seconds (time.time()), for people reading the status
    from_mode: ExecutorMode
    to_mode: ExecutorMode

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "from": self.from_mode.value, "to": self.to_mode.value}


class SlotConflict(Exception):
    """Two jobs for the ping and pong banks would share state. Never expected: a bug or crosstalk."""


@dataclass(frozen=True)
class _Slot:
    job: JobId
    inputs: HostBuffer
    outputs: HostBuffer
    seqs: frozenset[KvSeqId]
    requests: frozenset[RequestId]


class BankSlots:
    """The ping and pong banks of one alias's chip; at most one job on each. Not thread-safe, and needs no
    lock: only the engine core's thread (its device executor) calls it."""

    def __init__(self) -> None:
        self._slots: dict[Engine, _Slot | None] = {bank: None for bank in BANKS}
        self._last: Engine = Engine.PONG  # so the first job goes to ping

    def holders(self) -> dict[str, int | None]:
        return {bank.value: (int(s.job) if s is not None else None) for bank, s in self._slots.items()}

    def busy(self) -> int:
        return sum(s is not None for s in self._slots.values())

    def claim(
        self,
        job: JobId,
        inputs: HostBuffer,
        outputs: HostBuffer,
        seqs: tuple[KvSeqId, ...],
        requests: tuple[RequestId, ...],
    ) -> Engine | None:
        """Put ``job`` on the free bank (alternating). None when both banks hold a job.

        Raises :class:`SlotConflict` when the job would share a buffer, backing storage, a KV
        sequence or a request with the job on the other bank.
        """
        free = [b for b in BANKS if self._slots[b] is None]
        if not free:
            return None
        bank = free[0] if len(free) == 1 else (Engine.PONG if self._last is Engine.PING else Engine.PING)
        new = _Slot(job, inputs, outputs, frozenset(seqs), frozenset(requests))
        if inputs.shares_storage_with(outputs):
            raise SlotConflict(f"job {job}: its input and output buffers share storage")
        for other_bank, other in self._slots.items():
            if other is None:
                continue
            problems = _shared(new, other)
            if problems:
                raise SlotConflict(
                    f"job {job} for {bank.value} shares {', '.join(problems)} with job {other.job} on {other_bank.value}"
                )
        self._slots[bank] = new
        self._last = bank
        return bank

    def release(self, job: JobId) -> Engine | None:
        for bank, slot in self._slots.items():
            if slot is not None and slot.job == job:
                self._slots[bank] = None
                return bank
        return None

    def check_completion(self, job: JobId, bank: Engine, results_for: tuple[RequestId, ...]) -> str | None:
        """Before a ping/pong job's output is used: is it still this bank's job, and are its lane
        results only for its own requests? Returns what is wrong, or None."""
        slot = self._slots.get(bank)
        if slot is None or slot.job != job:
            holder = "nothing" if slot is None else f"job {slot.job}"
            return f"job {job} completed on {bank.value}, which holds {holder}"
        foreign = [r for r in results_for if r not in slot.requests]
        if foreign:
            return f"job {job} returned lane results for request(s) {', '.join(foreign)} that are not in the job"
        for other_bank, other in self._slots.items():
            if other is None or other_bank is bank:
                continue
            problems = _shared(slot, other)
            if problems:
                return (
                    f"job {job} on {bank.value} shares {', '.join(problems)} with job {other.job} on {other_bank.value}"
                )
        return None


def _shared(a: _Slot, b: _Slot) -> list[str]:
    problems = []
    for mine in (a.inputs, a.outputs):
        for theirs in (b.inputs, b.outputs):
            if mine.shares_storage_with(theirs):
                problems.append(
                    f"buffer storage ({mine.direction.value} {mine.id} / {theirs.direction.value} {theirs.id})"
                )
    if a.seqs & b.seqs:
        problems.append(f"KV sequence(s) {sorted(int(s) for s in a.seqs & b.seqs)}")
    if a.requests & b.requests:
        problems.append(f"request(s) {sorted(a.requests & b.requests)}")
    return problems


__all__ = [
    "BANKS",
    "BankSlots",
    "DowngradeReason",
    "DowngradeRecord",
    "OperatorModeChange",
    "SlotConflict",
]
