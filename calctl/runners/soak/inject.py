"""A diagnostic fault injector of the soak runner: a delivery tap that breaks a serving rule on purpose.

``calctl soak --inject stale-completion`` installs :class:`StaleRedelivery` on
each engine core (:meth:`~calctl.serving.engine.loop.EngineCore.add_taps`)
to prove that the soak's checker catches a completion from a retired generation
(000 §4 rule 4, 001 §13.1). It lives with the soak, not in the engine: serving/ carries no fault injector (a
unit test keeps it so), and the device faults live in the mock board's fault plans (docs/runtime.md §4).
"""

from __future__ import annotations

import logging

from calctl.serving.engine.streams import EngineStream
from calctl.serving.protocol import TokenEvent

log = logging.getLogger("calctl.serve")


class StaleRedelivery:
    """Remember the last token delivered; at the first token of a *newer* generation (after a reload or a
    recovery), deliver the remembered token, still tagged with its retired generation, to that new request
    as well. Once only: afterwards the tap does nothing (``fired``)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.fired = False
        self._last: TokenEvent | None = None

    def __call__(self, stream: EngineStream, event: TokenEvent) -> None:
        if self.fired:
            return
        old = self._last
        if (
            old is not None
            and old.generation is not None
            and event.generation is not None
            and old.generation < event.generation
        ):
            log.warning(
                "engine %s: DIAGNOSTIC stale-completion injection: re-delivering a token of retired generation "
                "%s to request %s (generation %s)",
                self.alias,
                old.generation,
                stream.request_id,
                event.generation,
            )
            stream.post_token(old)
            self.fired = True
            return
        self._last = event


__all__ = ["StaleRedelivery"]
