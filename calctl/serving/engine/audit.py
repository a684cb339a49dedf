"""The serving audit: ``calctl serve`` asks the board a question it knows the answer to, while it serves (issue 50).

The load's golden check (001 §11.1) proves the board right once, before Ready. A board that goes wrong later
(one job in hundreds reported done before its logits are written, a batch lane that crosses another's KV) would
then answer clients with wrong text and HTTP 200 until someone noticed. So :class:`BoardAudit`, a thread of the
server, every ``interval_s`` seconds and right after every recovery, sends each Ready alias its package's golden
prompt through the engine, like any client (admission, scheduling, batching with the traffic of the moment,
the output path), greedily, for as many tokens as the golden has, and compares the tokens:

* equal: ``pass``;
* different: ``fail``: the alias is taken out of service through the recovery path of 001 §11
  (:meth:`EngineCore.board_answered_wrong`: Ready -> Draining -> Recovering, a reset, golden and warm-up again,
  or Failed when the golden fails after the reset), and the log names the alias, the token and both values;
* refused at admission (the alias busy or away): ``skipped``, tried at the next tick;
* ended by a device error or a timeout: ``error`` (the engine's own fault handling already acts on it).

Each result is counted in ``calctl_audit_probes_total{model,result}``. The probes are requests of the tenant
:data:`AUDIT_TENANT` and show in the records and metrics as such. This module decides nothing about the board
beyond "this answer is wrong"; it starts no recovery of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass

from calctl.checks.golden import first_mismatch
from calctl.checks.steps import GoldenData
from calctl.serving.engine import ServingEngine
from calctl.serving.protocol import EngineRejection, FinishReason, GenerationRequest, SamplingParams

log = logging.getLogger("calctl.serve")

AUDIT_TENANT = "calctl-audit"
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ProbeResult:
    alias: str
    result: str  # pass | fail | skipped | error
    detail: str = ""


class BoardAudit:
    """The audit thread of one server: :meth:`start`, :meth:`stop`; :meth:`audit_once` is one round."""

    def __init__(self, engine: ServingEngine, interval_s: float, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"audit interval {interval_s} s: expected > 0 (0 turns the audit off before here)")
        self.engine = engine
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serve-audit", daemon=True)
        self._ids = itertools.count(1)
        self._golden: dict[tuple[str, str | None], GoldenData] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        sup = self.engine.supervisor
        seen = len(sup.recoveries)
        next_at = time.monotonic() + self.interval_s
        try:
            while not self._stop.wait(min(1.0, self.interval_s)):
                recovered = len(sup.recoveries) > seen  # 001 §13.3: a recovered board is asked again at once
                if recovered or time.monotonic() >= next_at:
                    seen = len(sup.recoveries)
                    next_at = time.monotonic() + self.interval_s
                    try:
                        self.audit_once(loop)
                    except Exception:  # an audit bug must not take the server down; say it loudly
                        log.exception("serving audit round failed")
        finally:
            loop.close()

    def audit_once(self, loop: asyncio.AbstractEventLoop | None = None) -> list[ProbeResult]:
        """Probe every Ready alias once (``loop``: the event loop to drive the streams on; a new one if None)."""
        own = loop is None
        loop = loop or asyncio.new_event_loop()
        try:
            out = []
            for alias, core in list(self.engine.supervisor.cores.items()):
                if not core.is_ready():
                    continue
                res = self._probe(loop, alias)
                self.engine.supervisor.metrics.audit.labels(alias, res.result).inc()
                out.append(res)
            return out
        finally:
            if own:
                loop.close()

    # -- one probe -----------------------------------------------------------------------------------

    def _golden_of(self, alias: str) -> GoldenData | None:
        loaded = self.engine.supervisor.loaded
        if loaded is None:
            return None
        key = (alias, loaded.digest)
        if key not in self._golden:
            self._golden[key] = GoldenData.load(loaded.package, alias)
        return self._golden[key]

    def _probe(self, loop: asyncio.AbstractEventLoop, alias: str) -> ProbeResult:
        golden = self._golden_of(alias)
        if golden is None:
            return ProbeResult(alias, "skipped", "no package loaded")
        req = GenerationRequest(
            request_id=f"audit-{alias}-{next(self._ids)}",
            alias=alias,
            tenant=AUDIT_TENANT,
            prompt_ids=golden.prompt,
            max_tokens=len(golden.tokens),
            sampling=SamplingParams(temperature=0.0),
            ignore_eos=True,
        )
        try:
            tokens, finish = loop.run_until_complete(asyncio.wait_for(self._tokens(req), self.timeout_s))
        except EngineRejection as exc:
            return ProbeResult(alias, "skipped", f"refused at admission: {exc.message}")
        except asyncio.TimeoutError:
            return ProbeResult(alias, "error", f"no answer within {self.timeout_s:g} s")
        if finish is FinishReason.ERROR:
            return ProbeResult(alias, "error", "the probe ended in a device error (the engine handles the fault)")
        if finish is FinishReason.CANCELLED:
            return ProbeResult(alias, "skipped", "the probe was cancelled (the alias left service meanwhile)")
        at = first_mismatch(golden.tokens, tuple(tokens))
        if at is None:
            return ProbeResult(alias, "pass")
        got = str(tokens[at]) if at < len(tokens) else "nothing"
        detail = (
            f"serving audit: {alias} answered its golden prompt wrong at output token {at}: expected "
            f"{golden.tokens[at]}, got {got}"
        )
        log.error("%s; taking %s out of service for a recovery (001 §11.3)", detail, alias)
        try:
            self.engine.supervisor.cores[alias].board_answered_wrong(detail)
        except Exception as exc:  # the core died or was replaced meanwhile: the probe's verdict still stands
            log.warning("audit of %s: could not request the recovery: %s", alias, exc)
        return ProbeResult(alias, "fail", detail)

    async def _tokens(self, req: GenerationRequest) -> tuple[list[int], FinishReason | None]:
        stream = self.engine.submit(req)
        await stream.admitted()
        tokens: list[int] = []
        finish: FinishReason | None = None
        async for ev in stream:
            if ev.token_id is not None and ev.finish is None:
                tokens.append(int(ev.token_id))
            if ev.finish is not None:
                finish = ev.finish
                break
        return tokens, finish


__all__ = ["AUDIT_TENANT", "BoardAudit", "ProbeResult"]
