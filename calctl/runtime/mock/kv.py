"""The mock board's KV manager: real K/V tensors per sequence, in the mock's memory (000 §9, docs/runtime.md).

Sequences live in a namespace per model alias, with the model's
``kv.max_sequences`` slots (0.7.6 ``canAllocate(seq_num)``). Each holds a
:class:`calctl.model.decoder.KvCache` the executing jobs write into, plus the
bookkeeping 000 §9.2 asks for: committed <= reserved <= max_seq, commit only
after the writing job succeeded, nothing touched while a job in flight is
bound to the sequence.

The store is guarded by the board's lock (passed in); :meth:`MockKvManager.bind`
checks a job's KV binding against its inputs at submit. It does not schedule
jobs and does not know about chips beyond the model's.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from calctl.model import decoder
from calctl.package.model import GraphKind
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.calbin import GraphPlan
from calctl.runtime.errors import DeviceBusy, InvalidArgument, NotConfigured, OutOfMemory
from calctl.runtime.mock import compute
from calctl.runtime.mock.compute import LoadedModel
from calctl.runtime.types import KvLength, KvSeqId


@dataclass
class KvSequence:
    id: KvSeqId
    model: str
    chips: tuple[int, ...]
    cache: decoder.KvCache
    committed: int = 0
    reserved: int = 0
    busy_job: int | None = None  # a job in flight is writing this sequence
    last_job_failed: bool = False  # the last writing job did not succeed: its tokens are not committable

    @property
    def length(self) -> KvLength:
        return KvLength(committed=self.committed, reserved=self.reserved)

    def wipe(self) -> None:
        """A reset lost the contents: empty the sequence (the slot stays allocated)."""
        self.cache.clear()
        self.committed = self.reserved = 0
        self.busy_job = None
        self.last_job_failed = False


@dataclass
class _Namespace:
    model: LoadedModel
    chips: tuple[int, ...]
    live: set[KvSeqId] = field(default_factory=set)


class MockKvManager:
    """Implements :class:`calctl.runtime.interface.KvManager` for the mock board."""

    def __init__(self, lock: threading.Condition) -> None:  # the board lock (an RLock-backed Condition)
        self._lock = lock
        self._ids = itertools.count(1)
        self._spaces: dict[str, _Namespace] = {}
        self._seqs: dict[KvSeqId, KvSequence] = {}

    # -- board side (called with the lock held) -------------------------------

    def install(self, models: dict[str, tuple[LoadedModel, tuple[int, ...]]]) -> None:
        self._spaces = {alias: _Namespace(model=m, chips=chips) for alias, (m, chips) in models.items()}
        self._seqs.clear()

    def drop_all(self) -> None:
        self._spaces = {}
        self._seqs.clear()

    def sequence(self, seq: KvSeqId) -> KvSequence:
        s = self._seqs.get(seq)
        if s is None:
            raise InvalidArgument(
                f"unknown KV sequence {seq} (never allocated, freed, or dropped by a reset of the configuration)"
            )
        return s

    def wipe_chips(self, chips: set[int]) -> None:
        for s in self._seqs.values():
            if chips.intersection(s.chips):
                s.wipe()

    # -- KvManager ---------------------------------------------------------------

    def can_allocate(self, model: str, n: int = 1) -> bool:
        with self._lock:
            space = self._space(model)
            return n >= 0 and len(space.live) + n <= space.model.max_sequences

    def allocate(self, model: str) -> KvSeqId:
        with self._lock:
            space = self._space(model)
            if len(space.live) >= space.model.max_sequences:
                raise OutOfMemory(f"model {model!r} has all {space.model.max_sequences} KV sequences allocated")
            seq = KvSeqId(next(self._ids))
            self._seqs[seq] = KvSequence(id=seq, model=model, chips=space.chips, cache=space.model.empty_cache())
            space.live.add(seq)
            return seq

    def append(self, seq: KvSeqId, n: int) -> int:
        with self._lock:
            s = self._idle(seq, "append to")
            cap = self._space(s.model).model.max_seq
            if n < 1 or s.reserved + n > cap:
                raise InvalidArgument(
                    f"KV sequence {seq}: cannot reserve {n} more tokens ({s.reserved} reserved, max_seq {cap})"
                )
            position = s.reserved
            s.reserved += n
            return position

    def commit(self, seq: KvSeqId) -> KvLength:
        with self._lock:
            s = self._idle(seq, "commit")
            if s.last_job_failed and s.reserved > s.committed:
                raise InvalidArgument(
                    f"KV sequence {seq}: the job that wrote the reserved tokens failed; rollback instead (000 §9.2)"
                )
            s.committed = s.reserved
            return s.length

    def rollback(self, seq: KvSeqId) -> KvLength:
        with self._lock:
            s = self._idle(seq, "roll back")
            s.reserved = s.committed
            s.last_job_failed = False
            return s.length

    def remove_tokens_at_end(self, seq: KvSeqId, n: int) -> KvLength:
        with self._lock:
            s = self._idle(seq, "trim")
            if s.reserved != s.committed:
                raise InvalidArgument(
                    f"KV sequence {seq}: {s.reserved - s.committed} tokens are reserved; commit or roll back first"
                )
            if not 0 <= n <= s.committed:
                raise InvalidArgument(f"KV sequence {seq}: cannot remove {n} of {s.committed} committed tokens")
            s.committed -= n
            s.reserved = s.committed
            return s.length

    def free(self, seq: KvSeqId) -> None:
        with self._lock:
            s = self._idle(seq, "free")
            del self._seqs[seq]
            space = self._spaces.get(s.model)
            if space is not None:
                space.live.discard(seq)

    def length(self, seq: KvSeqId) -> KvLength:
        with self._lock:
            return self.sequence(seq).length

    # -- helpers -----------------------------------------------------------------

    def bind(
        self, plan: GraphPlan, inputs: HostBuffer, lanes: tuple[KvSeqId | None, ...], vocab: int
    ) -> tuple[list[KvSequence | None], int, int]:
        """Check a job's KV binding against its CSR inputs (000 §9.2), one entry per lane, token ids below
        ``vocab``. Returns (the lanes' sequences, tokens the job writes, KV tokens it reads)."""
        if plan.kind is GraphKind.PREFILL:
            return self._bind_prefill(plan, inputs, lanes, vocab)
        return self._bind_decode(plan, inputs, lanes, vocab)

    def _bind_prefill(
        self, plan: GraphPlan, inputs: HostBuffer, lanes: tuple[KvSeqId | None, ...], vocab: int
    ) -> tuple[list[KvSequence | None], int, int]:
        n = compute.prefill_length(inputs)
        capacity = inputs.layout.slot("tokens").shape[1]
        if not 1 <= n <= capacity:
            raise InvalidArgument(f"graph {plan.name!r}: n_tokens {n} outside 1..{capacity}")
        tokens = inputs.device_view("tokens")[0, :n]
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise InvalidArgument(f"graph {plan.name!r}: token ids outside 0..{vocab - 1}")
        s = self._bound(plan, lanes[0], 0, n, set())
        if s.committed != 0:
            raise InvalidArgument(
                f"prefill writes from position 0 but KV sequence {s.id} has {s.committed} committed tokens"
            )
        return [s], n, 0

    def _bind_decode(
        self, plan: GraphPlan, inputs: HostBuffer, lanes: tuple[KvSeqId | None, ...], vocab: int
    ) -> tuple[list[KvSequence | None], int, int]:
        active = compute.decode_lanes(inputs)
        active_lanes = {lane for lane, _, _ in active}
        for lane, seq in enumerate(lanes):
            if lane not in active_lanes and seq is not None:
                raise InvalidArgument(
                    f"graph {plan.name!r} lane {lane} is inactive (lane_valid 0) but kv[{lane}] names sequence {seq}"
                )
        seqs: list[KvSequence | None] = [None] * inputs.batch
        seen: set[KvSeqId] = set()
        kv_tokens = 0
        for lane, token, position in active:
            s = self._bound(plan, lanes[lane], lane, 1, seen)
            if position != s.committed:
                raise InvalidArgument(
                    f"lane {lane}: position {position} != committed KV length {s.committed} of sequence {s.id} (000 §9.2)"
                )
            if not 0 <= token < vocab:
                raise InvalidArgument(f"lane {lane}: token id {token} outside 0..{vocab - 1}")
            seqs[lane] = s
            kv_tokens += position + 1
        return seqs, len(active), kv_tokens

    def _bound(
        self, plan: GraphPlan, seq: KvSeqId | None, lane: int, tokens_written: int, seen: set[KvSeqId]
    ) -> KvSequence:
        """The sequence bound to an active lane: the graph's model, on one lane of the job (``seen``), idle, with
        exactly the job's tokens reserved."""
        if seq is None:
            raise InvalidArgument(f"graph {plan.name!r} lane {lane} is active but kv[{lane}] is None")
        s = self.sequence(seq)
        if s.model != plan.model:
            raise InvalidArgument(
                f"KV sequence {seq} belongs to model {s.model!r}, graph {plan.name!r} to {plan.model!r}"
            )
        if seq in seen:
            raise InvalidArgument(f"KV sequence {seq} is bound to two lanes of one job")
        seen.add(seq)
        if s.busy_job is not None:
            raise DeviceBusy(f"KV sequence {seq} is being written by job {s.busy_job}", job=s.busy_job)
        if s.reserved - s.committed != tokens_written:
            raise InvalidArgument(
                f"KV sequence {seq} has {s.reserved - s.committed} reserved tokens, the job writes {tokens_written}; "
                "kv.append() exactly the tokens the job writes"
            )
        return s

    def _space(self, model: str) -> _Namespace:
        if not self._spaces:
            raise NotConfigured("no calbin is configured, so there is no KV manager")
        space = self._spaces.get(model)
        if space is None:
            raise InvalidArgument(f"no model {model!r} in the configured calbin (it has: {', '.join(self._spaces)})")
        return space

    def _idle(self, seq: KvSeqId, action: str) -> KvSequence:
        s = self.sequence(seq)
        if s.busy_job is not None:
            raise DeviceBusy(
                f"cannot {action} KV sequence {seq}: job {s.busy_job} in flight is writing it", job=s.busy_job
            )
        return s
