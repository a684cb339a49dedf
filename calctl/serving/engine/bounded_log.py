"""A log of the supervisor's events that keeps the newest, bounded by count and by bytes (docs/serve.md).

The supervisor's lifecycle history (one :class:`~calctl.serving.engine.options.LifecycleEvent` per state
change, about ten a reload) and its recovery records used to be plain lists: a server reloading every few
minutes grew ~3 KB a reload for as long as it ran. :class:`BoundedLog` keeps the newest entries while they
are at most ``max_entries`` and at most ``max_bytes`` (an estimate of the entries' Python objects, as the
runtime's job history does, :mod:`calctl.runtime.history`).

Positions are absolute: ``len(log)`` counts every entry ever appended, and ``log[n:]`` is what was appended
since ``len(log)`` was ``n`` (what a runner reads around one of its phases), the forgotten oldest left out.
Iteration, ``log[-1]`` and ``list(log)`` give the kept entries, oldest first.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

#: The lifecycle history's ceilings: ~300 bytes an event, ~10 events a reload: the last ~400 reloads.
HISTORY_ENTRIES = 4096
HISTORY_BYTES = 1024 * 1024
#: The recovery records' ceilings (each a few hundred bytes; the reset budget makes them rare).
RECOVERY_ENTRIES = 1024
RECOVERY_BYTES = 1024 * 1024


def estimated_bytes(entry: Any) -> int:
    """The entry's object, its fields' objects and their items' (one level down): what keeping it costs."""
    size = sys.getsizeof(entry) + 8  # + the deque slot
    values = [getattr(entry, f.name) for f in dataclasses.fields(entry)] if dataclasses.is_dataclass(entry) else []
    for value in values:
        size += sys.getsizeof(value)
        if isinstance(value, dict):
            size += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in value.items())
        elif isinstance(value, (tuple, list)):
            size += sum(sys.getsizeof(v) for v in value)
    return size


class BoundedLog(Generic[T]):
    """See the module docstring. Thread-safe: the supervisor appends from its lifecycle and recovery threads
    while the API and runners read."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"a bounded log needs room: max_entries {max_entries}, max_bytes {max_bytes}")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._kept: deque[tuple[T, int]] = deque()
        self._bytes = 0
        self._total = 0
        self._lock = threading.Lock()

    def append(self, entry: T) -> None:
        size = estimated_bytes(entry)
        with self._lock:
            self._kept.append((entry, size))
            self._bytes += size
            self._total += 1
            # The newest entry always stays, whatever its size.
            while len(self._kept) > 1 and (len(self._kept) > self.max_entries or self._bytes > self.max_bytes):
                self._bytes -= self._kept.popleft()[1]

    @property
    def kept(self) -> int:
        """How many entries are kept now (``len`` counts every one appended)."""
        return len(self._kept)

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return self._total

    def __iter__(self) -> Iterator[T]:
        with self._lock:
            return iter([entry for entry, _ in self._kept])

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        with self._lock:
            first = self._total - len(self._kept)  # the absolute position of the oldest kept entry
            if isinstance(index, slice):
                return [self._kept[i - first][0] for i in range(self._total)[index] if i >= first]
            at = index + self._total if index < 0 else index
            if not first <= at < self._total:
                raise IndexError(f"entry {index} is not kept (entries {first} to {self._total - 1} are)")
            return self._kept[at - first][0]

    def __repr__(self) -> str:
        return f"BoundedLog({self.kept} of {self._total} kept, {self._bytes} bytes)"


__all__ = ["HISTORY_BYTES", "HISTORY_ENTRIES", "RECOVERY_BYTES", "RECOVERY_ENTRIES", "BoundedLog", "estimated_bytes"]
