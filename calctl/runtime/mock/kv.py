"""The mock board's KV manager: real K/V tensors per sequence, in the mock's memory (000 §9, docs/runtime.md).

Sequences live in a namespace per model alias, with the model's
``kv.max_sequences`` slots (0.7.6 ``canAllocate(seq_num)``). Each holds a
:class:`calctl.model.decoder.KvCache` the executing jobs write into, plus the
bookkeeping 000 §9.2 asks for: committed <= reserved <= max_seq, commit only
after the writing job succeeded, nothing touched while a job in flight is
bound to the sequence.

The store is guarded by the board's lock (passed in); it does not schedule
jobs and does not know about chips beyond the model's.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from calctl.model import decoder
from calctl.runtime.errors import DeviceBusy, InvalidArgument, NotConfigured, OutOfMemory
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
