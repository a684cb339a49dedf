"""Per-job input/output buffers: layout and ownership (001 §9.1, 000 §14).

A :class:`HostBuffer` is the host-visible staging of one job's inputs or one
job's outputs for one graph at one batch profile. Tensors are packed in the
graph's manifest order, each at a 64-byte aligned offset (the layout the C ABI
fixes, docs/calrt-c-abi.md §6). Ownership is explicit:

* the caller owns a fresh buffer and may ``write``/``read`` it;
* from ``submit`` until the job reaches a terminal state the job owns it:
  ``write``, ``read`` and release raise :class:`BufferInUse`;
* a job that ends in UNKNOWN_DMA_STATE keeps it *quarantined* until a reset,
  because DMA may still reference it (001 §9.1);
* a buffer is never shared: one job at a time, and never as both inputs and outputs.

``read`` returns a copy and ``write`` copies in, so no caller ever holds a view
into memory the runtime may free. This module does not allocate device memory;
the backend supplies the storage and flips the ownership state under its lock.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.package.model import BATCH_DIM, DTYPE_BYTES, NUMPY_DTYPE, Graph
from calctl.runtime.errors import BufferInUse, InvalidArgument

#: Every tensor starts at a multiple of this many bytes (C ABI §6).
ALIGN = 64


class Direction(str, enum.Enum):
    INPUT = "input"
    OUTPUT = "output"


class BufferState(str, enum.Enum):
    OWNED_BY_CALLER = "owned_by_caller"
    IN_FLIGHT = "in_flight"
    QUARANTINED = "quarantined"  # unknown DMA state: held until a reset
    RELEASED = "released"


def numpy_dtype(dtype: str) -> np.dtype:
    """numpy storage for a manifest dtype; bf16 is carried as raw uint16."""
    if dtype in NUMPY_DTYPE:
        return np.dtype(NUMPY_DTYPE[dtype])
    if dtype in ("bf16", "bfloat16"):
        return np.dtype("uint16")
    raise InvalidArgument(f"dtype {dtype!r} has no host representation")


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    per_lane: bool = False  # the manifest's leading dimension is the batch B: row i is lane i's

    @property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)


@dataclass(frozen=True)
class BufferLayout:
    graph: str
    direction: Direction
    batch: int
    slots: tuple[TensorSlot, ...]
    nbytes: int

    def slot(self, name: str) -> TensorSlot:
        for s in self.slots:
            if s.name == name:
                return s
        raise InvalidArgument(
            f"{self.direction.value} buffer of graph {self.graph!r} has no tensor {name!r} "
            f"(it has: {', '.join(s.name for s in self.slots)})"
        )


def buffer_layout(graph: Graph, direction: Direction, batch: int) -> BufferLayout:
    """The packed layout of ``graph``'s inputs or outputs at batch profile ``batch``."""
    if batch not in graph.batch_profiles:
        raise InvalidArgument(
            f"graph {graph.name!r} has no batch profile B{batch} (compiled: {', '.join(f'B{b}' for b in graph.batch_profiles)})"
        )
    tensors = graph.inputs if direction is Direction.INPUT else graph.outputs
    slots = []
    offset = 0
    for t in tensors:
        if t.dtype not in DTYPE_BYTES:
            raise InvalidArgument(f"graph {graph.name!r} tensor {t.name!r} has unknown dtype {t.dtype!r}")
        offset += -offset % ALIGN
        shape = t.concrete_shape(batch)
        n = t.nbytes_at(batch)
        per_lane = bool(t.shape) and t.shape[0] == BATCH_DIM
        slots.append(TensorSlot(name=t.name, dtype=t.dtype, shape=shape, offset=offset, nbytes=n, per_lane=per_lane))
        offset += n
    return BufferLayout(graph=graph.name, direction=direction, batch=batch, slots=tuple(slots), nbytes=max(offset, 1))


class HostBuffer:
    """One job's input or output staging. Created by a runtime's ``alloc_inputs``/``alloc_outputs``."""

    def __init__(self, buffer_id: int, layout: BufferLayout, storage: np.ndarray, native: Any = None) -> None:
        if storage.dtype != np.uint8 or storage.ndim != 1 or storage.size < layout.nbytes:
            raise ValueError("storage must be a 1-D uint8 array of at least layout.nbytes")
        self.id = buffer_id
        self.layout = layout
        self._storage: np.ndarray | None = storage
        self._native = native  # backend handle (ctypes pointer) or None
        self._state = BufferState.OWNED_BY_CALLER
        self._job: int | None = None
        self._lock = threading.Lock()

    # -- caller API ---------------------------------------------------------

    @property
    def graph(self) -> str:
        return self.layout.graph

    @property
    def direction(self) -> Direction:
        return self.layout.direction

    @property
    def batch(self) -> int:
        return self.layout.batch

    @property
    def state(self) -> BufferState:
        return self._state

    @property
    def job(self) -> int | None:
        """The job that owns the buffer now (in flight or quarantined), else None."""
        return self._job

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.layout.slots)

    def write(self, name: str, value: Any) -> None:
        """Copy ``value`` (exact shape, same-kind dtype) into tensor ``name``."""
        slot = self.layout.slot(name)
        arr = np.asarray(value)
        if arr.shape != slot.shape:
            raise InvalidArgument(f"{self._what()}: tensor {name!r} has shape {slot.shape}, got {arr.shape}")
        if not np.can_cast(arr.dtype, slot.np_dtype, casting="same_kind"):
            raise InvalidArgument(f"{self._what()}: tensor {name!r} is {slot.dtype}, got {arr.dtype}")
        with self._lock:
            self._check_caller_owned("write")
            self._view_locked(slot)[...] = arr

    def read(self, name: str, *, lanes: int | None = None) -> np.ndarray:
        """A copy of tensor ``name``; with ``lanes``, of its first ``lanes`` rows only when its leading dimension
        is the batch B (a decode job's active lanes: what inactive lanes return is the package's
        ``inactive_lane_policy``, and the engine reads none of it)."""
        slot = self.layout.slot(name)
        with self._lock:
            self._check_caller_owned("read")
            view = self._view_locked(slot)
            return (view[:lanes] if self._per_lane(slot, lanes) else view).copy()

    def clear(self, *, lanes: int | None = None) -> None:
        """Zero the whole buffer (e.g. before reusing it for the next job); with ``lanes``, only the first
        ``lanes`` rows of each tensor whose leading dimension is the batch B, and the other tensors whole."""
        with self._lock:
            self._check_caller_owned("clear")
            assert self._storage is not None
            if lanes is None:
                self._storage[: self.layout.nbytes] = 0
                return
            for slot in self.layout.slots:
                view = self._view_locked(slot)
                (view[:lanes] if self._per_lane(slot, lanes) else view)[...] = 0

    def shares_storage_with(self, other: HostBuffer) -> bool:
        """True when the two buffers are one buffer or share any byte of backing storage (000 §14:
        two jobs in flight together must not). A released buffer shares nothing."""
        if other is self or other.id == self.id:
            return True
        with self._lock:
            mine = self._storage
        with other._lock:
            theirs = other._storage
        if mine is None or theirs is None:
            return False
        return bool(np.shares_memory(mine, theirs))

    # -- runtime API (called by backends under their own lock) ---------------

    def device_view(self, name: str) -> np.ndarray:
        """A live view for the executing backend only; callers use read/write."""
        with self._lock:
            if self._storage is None:
                raise InvalidArgument(f"{self._what()} was released")
            return self._view_locked(self.layout.slot(name))

    @property
    def native(self) -> Any:
        return self._native

    def lend(self, job: int) -> None:
        with self._lock:
            self._check_caller_owned("submit")
            self._state = BufferState.IN_FLIGHT
            self._job = job

    def give_back(self) -> None:
        with self._lock:
            if self._state in (BufferState.IN_FLIGHT, BufferState.QUARANTINED):
                self._state = BufferState.OWNED_BY_CALLER
                self._job = None

    def quarantine(self) -> None:
        with self._lock:
            if self._state is BufferState.IN_FLIGHT:
                self._state = BufferState.QUARANTINED

    def check_releasable(self) -> None:
        with self._lock:
            if self._state in (BufferState.IN_FLIGHT, BufferState.QUARANTINED):
                raise BufferInUse(
                    f"{self._what()} is owned by job {self._job} ({self._state.value}); "
                    "release it after the job completes (or after a reset if its DMA state is unknown)",
                    job=self._job,
                )

    def mark_released(self) -> None:
        with self._lock:
            self._state = BufferState.RELEASED
            self._storage = None
            self._native = None
            self._job = None

    # -- helpers --------------------------------------------------------------

    def _what(self) -> str:
        return f"{self.direction.value} buffer {self.id} of graph {self.graph!r}"

    def _check_caller_owned(self, action: str) -> None:
        if self._state is BufferState.RELEASED:
            raise InvalidArgument(f"cannot {action}: {self._what()} was released")
        if self._state is not BufferState.OWNED_BY_CALLER:
            raise BufferInUse(
                f"cannot {action}: {self._what()} is owned by job {self._job} ({self._state.value})", job=self._job
            )

    def _per_lane(self, slot: TensorSlot, lanes: int | None) -> bool:
        if lanes is None:
            return False
        if not isinstance(lanes, int) or isinstance(lanes, bool) or not 0 <= lanes <= self.batch:
            raise InvalidArgument(f"{self._what()}: {lanes!r} lanes asked for, the batch has {self.batch}")
        return slot.per_lane

    def _view_locked(self, slot: TensorSlot) -> np.ndarray:
        assert self._storage is not None
        raw = self._storage[slot.offset : slot.offset + slot.nbytes]
        return raw.view(slot.np_dtype).reshape(slot.shape)

    def __repr__(self) -> str:
        return f"HostBuffer(id={self.id}, graph={self.graph!r}, {self.direction.value}, B{self.batch}, {self._state.value})"
