"""The serving engine's log as the runner commands show it (stderr)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _EngineLog(logging.Filter):
    """The serving engine's log during a run that serves traffic (soak, and bringup's and accept's steps): a
    deadline the soak's mix set that expires before output is the workload's intent, counted in the summary,
    not a warning; a line the engine repeats at every load (a package note: the test-only key, random
    weights) is shown once."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "ended before output: deadline expired" in message:
            return False
        if message in self._seen:
            return False
        self._seen.add(message)
        return True


@contextlib.contextmanager
def quiet_engine_log() -> Iterator[None]:
    logger = logging.getLogger("calctl.serve")
    quiet = _EngineLog()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
