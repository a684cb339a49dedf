"""Per-request and per-job records as NDJSON (001 §14): internal, so the only place chip ids appear.

One JSON object per line, ``"record": "request"`` or ``"record": "job"``:

* request (written when the request ends, accepted or not): ``request_id``,
  ``model_alias``, ``model_generation``, ``chips``, ``tenant``,
  ``prompt_tokens``, ``output_tokens``, ``queue_ms``, ``ttft_ms``, ``tpot_ms``,
  ``e2e_ms``, ``finish_reason``, ``error_class``;
* job (written when the job completes or times out): ``job_id``,
  ``model_alias``, ``generation``, ``graph``, ``kind``, ``engine``, ``chips``,
  ``lanes``, ``submit_ns``, ``done_ns``, ``h2d_ms``, ``infer_ms``,
  ``d2h_ms``, ``device_ms``, ``output_status``, ``kv_before``, ``kv_after``,
  ``reset_generation``.

A value the engine or the runtime cannot tell is ``null``, never 0 and never
omitted: a runtime that reports no job phases gives ``h2d_ms``/``infer_ms``/
``d2h_ms`` null; a job that timed out has no ``done_ns``. Request and job ids
go here (and to logs), never to Prometheus labels.

A flight recorder is always on, with or without a destination: the sink keeps
the last :data:`RECENT_KEEP` records of each kind in memory, and a recovery
attaches the ones of the aliases it touched to its evidence file (001 §11.3
"保存 trace"; ``calctl-recovery-evidence/v1``, docs/serve.md). Kept-only job
records do not scan the runtime trace for their phases on the hot path: the
evidence fills ``h2d_ms``/``infer_ms``/``d2h_ms`` from the trace window it saves.

Where: ``calctl serve --records DIR`` writes ``DIR/records.ndjson``, rotated at
``--records-max-mb`` (default 64 MiB) with 5 older files kept
(``records.ndjson.1`` … ``.5``, as :class:`logging.handlers.RotatingFileHandler` names them);
``--records -`` writes to stderr, a line as it is made. Without ``--records`` nothing is written.

Into a directory, records are buffered and written at most :data:`FLUSH_S` after they were made, many in one
write, and on close. A line a record used to cost two stats, a seek, a write and a flush on the engine thread;
each of those system calls hands the interpreter lock to another thread, and on a busy host getting it back
took milliseconds, a third of the engine thread's time in a 1,000-request isolation run. What a killed server
loses is its last :data:`FLUSH_S` of records, never a line cut in half.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, TextIO

from calctl.errors import UsageError
from calctl.records import dumps_line

log = logging.getLogger("calctl.serve")

RECORDS_FILE = "records.ndjson"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
BACKUPS = 5
FLUSH_S = 0.2  # a buffered record reaches the file at most this long after it was made
RECENT_KEEP = 256  # records of each kind the flight recorder keeps for recovery evidence

REQUEST_FIELDS = (
    "request_id",
    "model_alias",
    "model_generation",
    "chips",
    "tenant",
    "prompt_tokens",
    "output_tokens",
    "queue_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "finish_reason",
    "error_class",
)
JOB_FIELDS = (
    "job_id",
    "model_alias",
    "generation",
    "graph",
    "kind",
    "engine",
    "chips",
    "lanes",
    "submit_ns",
    "done_ns",
    "h2d_ms",
    "infer_ms",
    "d2h_ms",
    "device_ms",
    "output_status",
    "kv_before",
    "kv_after",
    "reset_generation",
)


class _RotatingLines:
    """``path`` and its :data:`BACKUPS` predecessors, as lines: ``add`` buffers, a writer thread writes what was
    added within :data:`FLUSH_S` in one write (and sleeps while nothing is), rotating when a file would pass
    ``max_bytes`` (counted, not asked of the file system). A write that fails drops its lines and calls
    ``failed(count, exc)``; one that succeeds calls ``written()``. Rotation renames only a regular file
    (bpo-45401: never rotate /dev/null and the like)."""

    def __init__(self, path: Path, max_bytes: int, failed: Any, written: Any) -> None:
        self.path, self.max_bytes = path, max_bytes
        self._failed, self._written = failed, written
        self._file = path.open("ab", buffering=0)
        self._size = self._file.tell()
        self._pending: list[bytes] = []
        self._cond = threading.Condition()  # guards _pending and _closed
        self._io = threading.Lock()  # guards the file: one writer at a time, never holding up add()
        self._closed = False
        self._writer = threading.Thread(target=self._run, name="calctl-records", daemon=True)
        self._writer.start()

    def add(self, line: str) -> None:
        with self._cond:
            self._pending.append(line.encode() + b"\n")
            if len(self._pending) == 1:
                self._cond.notify()

    def _run(self) -> None:
        closed = False
        while not closed:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._closed:  # let the lines of the next FLUSH_S gather: one write for all (close wakes it)
                    self._cond.wait(FLUSH_S)
                closed = self._closed
            self.flush()

    def flush(self) -> None:
        with self._io:
            with self._cond:
                lines, self._pending = self._pending, []
            self._write_lines(lines)

    def _write_lines(self, lines: list[bytes]) -> None:
        left = len(lines)
        chunk: list[bytes] = []
        used = self._size
        try:
            for line in lines:
                if used and used + len(line) > self.max_bytes:
                    self._write(chunk)
                    left -= len(chunk)
                    chunk = []
                    self._rotate()
                    used = 0
                chunk.append(line)
                used += len(line)
            self._write(chunk)
        except OSError as exc:
            self._failed(left, exc)
            return
        if lines:
            self._written()

    def _write(self, chunk: list[bytes]) -> None:
        view = memoryview(b"".join(chunk))
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError(errno.EIO, "the file took no bytes")
            view = view[n:]
        self._size += sum(len(c) for c in chunk)

    def _rotate(self) -> None:
        if not self.path.is_file():  # a device or a pipe: nothing to rename
            self._size = 0
            return
        self._file.close()
        for k in range(BACKUPS - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{k}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{k + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self.path.open("ab", buffering=0)
        self._size = 0

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._writer.join()
        self.flush()
        with self._io:
            self._file.close()


class _StreamLines:
    """Lines written to a text stream as they are made (``--records -``: stderr)."""

    def __init__(self, stream: TextIO, failed: Any, written: Any) -> None:
        self._stream, self._failed, self._written = stream, failed, written
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError) as exc:  # ValueError: a closed stream
                self._failed(1, exc)
                return
            self._written()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._stream.flush()


class RecordSink:
    """Writes records, one line each, from any thread, and keeps the last ``keep`` of each kind in memory (the
    flight recorder, :meth:`recent`).

    ``RecordSink()`` writes nothing (``enabled`` is False) but still keeps the recent records."""

    def __init__(self, *, where: str | None = None, keep: int = RECENT_KEEP) -> None:
        self._out: _RotatingLines | _StreamLines | None = None
        self.where = where
        self._lock = threading.Lock()
        self.dropped = 0  # records the destination refused (a full disk, a closed stream)
        self._failing = False  # in a streak of failed writes: logged once, when it began
        # kind -> the last records of that kind, each with the runtime's job id (None for requests) so the
        # recovery evidence can fill a kept-only job's phases from its trace window.
        self._recent: dict[str, deque[tuple[dict[str, Any], int | None]]] = {
            "request": deque(maxlen=keep),
            "job": deque(maxlen=keep),
        }

    @property
    def enabled(self) -> bool:
        """True when records are written somewhere (then job records carry their phases from the trace)."""
        return self._out is not None

    def recent(self, kind: str, aliases: Collection[str] | None = None) -> list[tuple[dict[str, Any], int | None]]:
        """The kept records of ``kind`` (oldest first), of ``aliases`` only when given: (record, runtime job id)."""
        with self._lock:
            rows = list(self._recent[kind])
        return [r for r in rows if aliases is None or r[0]["model_alias"] in aliases]

    @classmethod
    def to_directory(cls, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> RecordSink:
        if max_bytes <= 0:
            raise UsageError(f"--records-max-mb: must be > 0, got {max_bytes / 2**20:g}")
        sink = cls(where=str(directory / RECORDS_FILE))
        try:
            directory.mkdir(parents=True, exist_ok=True)
            sink._out = _RotatingLines(directory / RECORDS_FILE, max_bytes, sink._write_failed, sink._write_ok)
        except OSError as exc:
            raise UsageError(
                f"--records {directory}: cannot write records there ({exc.strerror or exc})",
                hint="pass a writable directory, or `-` for stderr",
            ) from None
        return sink

    @classmethod
    def to_stream(cls, stream: TextIO | None = None) -> RecordSink:
        sink = cls(where="stderr")
        sink._out = _StreamLines(stream or sys.stderr, sink._write_failed, sink._write_ok)
        return sink

    def request(self, **fields: Any) -> None:
        self._write("request", REQUEST_FIELDS, fields, None)

    def job(self, *, runtime_job: int | None = None, **fields: Any) -> None:
        self._write("job", JOB_FIELDS, fields, runtime_job)

    def _write(self, kind: str, names: tuple[str, ...], fields: dict[str, Any], runtime_job: int | None) -> None:
        unknown = set(fields) - set(names)
        if unknown:  # a programming error: a record has exactly its documented fields
            raise ValueError(f"{kind} record: unknown field(s) {sorted(unknown)}")
        doc = {"record": kind, "ts": round(time.time(), 6), **{n: fields.get(n) for n in names}}
        with self._lock:
            self._recent[kind].append((doc, runtime_job))
        if self._out is not None:
            self._out.add(dumps_line(doc)[:-1])  # the one JSON form: a value that is not finite is null

    def flush(self) -> None:
        """Write what is buffered now (a directory's records are otherwise written within FLUSH_S)."""
        if self._out is not None:
            self._out.flush()

    def _write_ok(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("records: writing to %s again; %d record(s) were dropped", self.where, self.dropped)

    def _write_failed(self, count: int, exc: BaseException) -> None:
        """Instead of a traceback per record on stderr, count the records as dropped and say so once per streak
        of failures (the serving goes on; the flight recorder keeps its copy)."""
        self.dropped += count
        if self._failing:
            return
        self._failing = True
        why = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__
        log.error("records: cannot write to %s (%s); records are dropped until it can be written", self.where, why)

    def close(self) -> None:
        """Write what is buffered and close the destination (a last failed write is counted and logged)."""
        if self._out is not None:
            out, self._out = self._out, None
            out.close()


def job_phases(trace: Iterable[Any], runtime_job: int) -> dict[str, float]:
    """Milliseconds per phase (``h2d``, ``compute``, ``d2h``) of one runtime job, summed from its trace events."""
    phases: dict[str, float] = {}
    for ev in trace:
        if ev.job == runtime_job and ev.phases:
            for p in ev.phases:
                phases[p.phase.value] = round(phases.get(p.phase.value, 0.0) + (p.end_ns - p.start_ns) / 1e6, 3)
    return phases


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


__all__ = ["BACKUPS", "JOB_FIELDS", "RECENT_KEEP", "RECORDS_FILE", "REQUEST_FIELDS", "RecordSink", "job_phases", "ms"]
