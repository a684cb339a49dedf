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
(``records.ndjson.1`` … ``.5``; :class:`logging.handlers.RotatingFileHandler`);
``--records -`` writes to stderr. Without ``--records`` nothing is written.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, TextIO

from calctl.errors import UsageError

log = logging.getLogger("calctl.serve")

RECORDS_FILE = "records.ndjson"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
BACKUPS = 5
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


class RecordSink:
    """Writes records, one line each, from any thread (the logging handler holds the lock), and keeps the last
    ``keep`` of each kind in memory (the flight recorder, :meth:`recent`).

    ``RecordSink()`` writes nothing (``enabled`` is False) but still keeps the recent records."""

    def __init__(self, handler: logging.Handler | None = None, *, where: str | None = None, keep: int = RECENT_KEEP):
        self._handler = handler
        self.where = where
        if handler is not None:
            handler.setFormatter(logging.Formatter("%(message)s"))
            handler.handleError = self._write_failed  # type: ignore[method-assign]
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
        return self._handler is not None

    def recent(self, kind: str, aliases: Collection[str] | None = None) -> list[tuple[dict[str, Any], int | None]]:
        """The kept records of ``kind`` (oldest first), of ``aliases`` only when given: (record, runtime job id)."""
        with self._lock:
            rows = list(self._recent[kind])
        return [r for r in rows if aliases is None or r[0]["model_alias"] in aliases]

    @classmethod
    def to_directory(cls, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> RecordSink:
        if max_bytes <= 0:
            raise UsageError(f"--records-max-mb: must be > 0, got {max_bytes / 2**20:g}")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                directory / RECORDS_FILE, maxBytes=max_bytes, backupCount=BACKUPS, encoding="utf-8"
            )
        except OSError as exc:
            raise UsageError(
                f"--records {directory}: cannot write records there ({exc.strerror or exc})",
                hint="pass a writable directory, or `-` for stderr",
            ) from None
        return cls(handler, where=str(directory / RECORDS_FILE))

    @classmethod
    def to_stream(cls, stream: TextIO | None = None) -> RecordSink:
        return cls(logging.StreamHandler(stream or sys.stderr), where="stderr")

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
        h = self._handler
        if h is None:
            return
        failed_before = self.dropped
        h.handle(logging.makeLogRecord({"msg": json.dumps(doc, separators=(",", ":")), "levelno": logging.INFO}))
        if self._failing and self.dropped == failed_before:
            self._failing = False
            log.warning("records: writing to %s again; %d record(s) were dropped", self.where, self.dropped)

    def _write_failed(self, record: logging.LogRecord) -> None:
        """logging's handleError: instead of a traceback per record on stderr, count the record as dropped
        and say so once per streak of failures (the serving goes on; the flight recorder keeps its copy)."""
        self.dropped += 1
        if self._failing:
            return
        self._failing = True
        exc = sys.exc_info()[1]
        why = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__
        log.error("records: cannot write to %s (%s); records are dropped until it can be written", self.where, why)

    def close(self) -> None:
        if self._handler is not None:
            try:
                self._handler.close()
            except OSError as exc:  # the last flush on a full disk: already counted and logged, never a traceback
                log.error("records: closing %s failed (%s)", self.where, exc.strerror or exc)


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
