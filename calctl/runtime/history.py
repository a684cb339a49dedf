"""The history of finished jobs a device keeps, bounded by count and by host memory (docs/runtime.md).

Both backends keep, for ``wait``/``query``/``trace``, each finished job's result and its trace events (one
per chip, with the job's phase intervals). Kept for the last 65,536 jobs with no other bound, that was
~1.36 KB a job, ~85 MiB when full: a fresh server grew that much before levelling off, and a soak judged the
growth as a leak (issues 49 and 53). :class:`KeptJobs` is the ledger of what is kept, oldest first: a job
joins it as it finishes, with its estimated bytes, and the oldest jobs leave it while more than ``history``
trace events or more than ``history_bytes`` bytes are kept.

The bytes are an estimate of the Python objects a job leaves behind (its ``JobResult`` with its ``Job``, its
``TraceEvent`` objects and phase intervals, and the containers' slots), measured once per shape of job (chips,
batch, phases, the length of a failure's text) with ``sys.getsizeof`` over the objects, not a guess per field.
A test holds it within 25 % of what ``tracemalloc`` sees.

This module keeps no job itself and takes no lock: the backend's bookkeeping (:mod:`calctl.runtime.bookkeeping`)
holds the results and events, under its lock, and drops what :meth:`KeptJobs.add` says left.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

from calctl.errors import ConfigError
from calctl.runtime.types import JobId

MIB = 1024**2
#: The environment variable that sets ``history_bytes`` (in MiB) for a device opened without an explicit one.
HISTORY_ENV = "CALCTL_JOB_HISTORY_MIB"
#: The default ceiling: about 12,000 finished single-chip jobs; a runner's own window (a bench phase, a
#: recovery's evidence window) reads far fewer.
DEFAULT_HISTORY_MIB = 16
DEFAULT_HISTORY_BYTES = DEFAULT_HISTORY_MIB * MIB
#: Per job, what the containers holding it add beyond its objects: the backend's dict entry for its result
#: (an OrderedDict slot and its links), the ledger's deque slot and the trace deques' slots.
_CONTAINER_BYTES = 120


def history_bytes_from_env(default: int = DEFAULT_HISTORY_BYTES) -> int:
    """``history_bytes`` from ``$CALCTL_JOB_HISTORY_MIB`` (a positive number of MiB), else ``default``."""
    raw = os.environ.get(HISTORY_ENV)
    if raw is None or not raw.strip():
        return default
    try:
        mib = float(raw)
    except ValueError:
        mib = float("nan")
    if not mib >= 1 or mib > 1024 * 1024:
        raise ConfigError(
            f"{HISTORY_ENV}={raw!r}: expected the MiB of host memory the device keeps for finished jobs, "
            f"a number from 1 to 1048576 (default {DEFAULT_HISTORY_MIB})"
        )
    return int(mib * MIB)


@dataclass(frozen=True)
class JobHistoryUsage:
    """How much of the bounded history is in use. ``evicted``: jobs dropped since the device opened (the
    history is full, and levelled off, once it is above 0)."""

    jobs: int
    events: int
    bytes: int
    ceiling_events: int
    ceiling_bytes: int
    evicted: int

    @property
    def full(self) -> bool:
        return self.evicted > 0

    def describe(self) -> str:
        return (
            f"{self.jobs} jobs, {self.bytes / MIB:.1f} of {self.ceiling_bytes / MIB:.1f} MiB, "
            f"{self.events} of {self.ceiling_events} trace events"
        )


@dataclass(frozen=True)
class Evicted:
    """A job that left the history: the backend drops its result and its ``events`` oldest trace events."""

    job: JobId
    events: int


@runtime_checkable
class KeepsJobHistory(Protocol):
    """A runtime that says how full its bounded history of finished jobs is (both backends do)."""

    def job_history(self) -> JobHistoryUsage: ...


class KeptJobs:
    """The ledger of finished jobs kept, oldest first, with their estimated bytes (see the module docstring)."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ConfigError(f"job history: events ({max_events}) and bytes ({max_bytes}) must be >= 1")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._ledger: deque[tuple[JobId, int, int]] = deque()  # (job, trace events, bytes)
        self._events = 0
        self._bytes = 0
        self._evicted = 0
        self._sizes: dict[tuple[Any, ...], int] = {}  # bytes per shape of job, measured once

    def add(self, job: JobId, result: Any, events: tuple[Any, ...]) -> list[Evicted]:
        """Keep a finished job; return the oldest ones that left to stay within both bounds. The newest job
        always stays (an MCHIP job's two events with room for one: both are kept)."""
        size = self._size(result, events)
        self._ledger.append((job, len(events), size))
        self._events += len(events)
        self._bytes += size
        gone: list[Evicted] = []
        while len(self._ledger) > 1 and (self._events > self.max_events or self._bytes > self.max_bytes):
            old, n, b = self._ledger.popleft()
            self._events -= n
            self._bytes -= b
            self._evicted += 1
            gone.append(Evicted(old, n))
        return gone

    def usage(self) -> JobHistoryUsage:
        return JobHistoryUsage(
            len(self._ledger), self._events, self._bytes, self.max_events, self.max_bytes, self._evicted
        )

    def _size(self, result: Any, events: tuple[Any, ...]) -> int:
        job = result.job if hasattr(result, "job") else None
        phases = events[0].phases if events else None
        key = (
            len(events),
            getattr(job, "batch", 1),
            None if phases is None else len(phases),
            len(getattr(result, "detail", None) or ""),
        )
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = deep_size((result, events)) + _CONTAINER_BYTES + 40 * len(events)
        return size


def deep_size(obj: Any) -> int:
    """``sys.getsizeof`` over ``obj`` and what it holds (tuples, lists, dataclass fields, namespaces), each
    object once. Enum members and strings shared with the configuration (graph and model names) are not the
    job's: enum members are skipped; a string is counted once per job, which overstates a little."""
    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, enum.Enum) or o is None:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, tuple | list):
            stack.extend(o)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
        elif isinstance(o, SimpleNamespace):
            stack.extend(vars(o).values())
    return total


__all__ = [
    "DEFAULT_HISTORY_BYTES",
    "HISTORY_ENV",
    "Evicted",
    "JobHistoryUsage",
    "KeepsJobHistory",
    "KeptJobs",
    "deep_size",
    "history_bytes_from_env",
]
