"""The accept ``rollback`` step: roll forward from the previous version to PKG and back, under traffic.

001 §17 G5 ("rollback passes") and 000 §19 M4 ("one-call rollback to the old
version") ask for a version change undone in one call while the models serve.
This module measures exactly that on one board, in-process through the serving
engine (docs/accept.md, "The rollback step"):

1. ``DeviceSupervisor.start(previous)``: the old version serves (golden and
   warm-up before publish, 000 §11);
2. clients stream greedy requests to every alias the whole time;
3. ``reload(PKG)`` (the roll forward), then ``rollback()`` (one call back to the
   retained old version); each stage between the calls serves for a while and
   answers a fixed greedy probe per alias.

What it checks, each named in ``problems`` when it does not hold: every call
ok; the served package digest is the previous one, then PKG's, then the
previous one again (and the two differ: a version change, not the same package
twice); generations only grow and every request's tokens carry one generation;
every stage served each alias; no request ended other than ``ok`` or refused
before its first token while the models were away (503 ``unavailable``, the
documented answer during a reload, docs/serve.md); every alias Ready at the
end; the probe after the rollback gives the same tokens as before the roll
forward (the old version is back on the device, whatever it outputs).

This module judges nothing about rows (``rows.py`` does) and prints nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from calctl.errors import CalctlError
from calctl.package.info import package_digest
from calctl.package.reader import package_root
from calctl.runners.device import DeviceSpec
from calctl.runners.serving_stack import ServingStack
from calctl.runners.traffic import (
    ClientPlan,
    EngineResult,
    RequestOutcome,
    TokenTap,
    drive_engine_request,
)
from calctl.serving.engine import LifecycleResult, RollbackResult, SupervisorOptions
from calctl.serving.protocol import GenerationRequest, SamplingParams
from calctl.signing.policy import TrustPolicy
from calctl.signing.seal import CHECKSUMS, parse_checksums

#: Streaming clients per alias during the whole step.
CLIENTS_PER_ALIAS = 2
PROMPT = tuple(range(10, 22))
MAX_TOKENS = 8
#: The fixed greedy probe of every stage (the same prompt and length for every alias and version).
PROBE_PROMPT = (5, 17, 29, 41, 53, 65, 77, 89)
PROBE_TOKENS = 8
#: What :meth:`_act` runs: a lifecycle call of the supervisor (its answer is recorded as JSON).
R = TypeVar("R", bound=LifecycleResult)
#: The outcomes a request may have while a reload takes the models away: refused before its first token.
REFUSED = RequestOutcome.UNAVAILABLE

Log = Callable[[str], None]


class SamePackage(Exception):
    """``--previous`` and PKG are one package (same digest): there is no version change to roll back."""


@dataclass
class _Stage:
    name: str  # serving-previous | roll-forward | serving-package | rollback | rolled-back
    started: float = 0.0
    ended: float = 0.0
    serving_digest: str | None = None
    generations: dict[str, int] = field(default_factory=dict)
    probe: dict[str, list[int]] = field(default_factory=dict)
    results: list[EngineResult] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        by_alias: dict[str, Counter[str]] = {}
        for r in self.results:
            by_alias.setdefault(r.record.alias, Counter())[r.record.outcome.value] += 1
        return {
            "stage": self.name,
            "seconds": round(self.ended - self.started, 3),
            "serving_digest": self.serving_digest,
            "generations": dict(self.generations),
            "requests": {a: dict(sorted(c.items())) for a, c in sorted(by_alias.items())},
            "probe": dict(self.probe),
            # every request, so "no request got tokens of two generations" can be recomputed from this file
            "request_generations": [
                {
                    "request": r.request_id,
                    "alias": r.record.alias,
                    "outcome": r.record.outcome.value,
                    "token_generations": sorted({g for g in r.token_generations if g is not None}),
                }
                for r in self.results
            ],
        }


@dataclass(frozen=True)
class RollbackOutcome:
    """What one roll forward and back did: the stages (steady ones serve, the others act under traffic), the
    supervisor's answers, every request's outcome, the probes, and what went wrong (``problems``: none is ok)."""

    previous: Path
    package: Path
    digests: dict[str, str | None]  # previous, package
    actions: tuple[dict[str, Any], ...]  # the supervisor's start, reload and rollback answers
    stages: tuple[_Stage, ...]
    requests: dict[str, int]  # sent, then every outcome's count
    probe_changed_with_version: dict[str, bool]
    ready_after: dict[str, bool]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """``old -> new -> rollback to old under traffic: generation model-a 1 -> 2 -> 3; 120 requests, ...``."""
        gens = {s.name: s.generations for s in self.stages if s.name.startswith(("serving", "rolled"))}
        chains = ", ".join(
            f"{a} " + " -> ".join(str(g.get(a)) for g in gens.values()) for a in next(iter(gens.values()), {})
        )
        req = self.requests
        return (
            f"{self.previous.name} -> {self.package.name} -> rollback to {self.previous.name} under traffic: "
            f"generation {chains}; {req['sent']} requests, {req.get('ok', 0)} ok, {req.get('unavailable', 0)} refused "
            "during the reloads" + ("; every alias Ready" if self.ok else f"; FAILED: {self.problems[0]}")
        )

    def document(self) -> dict[str, Any]:
        """The step's body in ``rollback.json``."""
        return {
            "ok": self.ok,
            "previous": str(self.previous),
            "package": str(self.package),
            "digests": dict(self.digests),
            "actions": list(self.actions),
            "stages": [s.document() for s in self.stages],
            "requests": dict(self.requests),
            "probe_changed_with_version": dict(self.probe_changed_with_version),
            "ready_after": dict(self.ready_after),
            "problems": list(self.problems),
        }


def digest_of(path: Path) -> str | None:
    with package_root(path) as root:
        return package_digest(root)


def contents_of(path: Path) -> dict[str, str] | None:
    """The package's sealed files and their hashes (``checksums.sha256`` parsed): two packages with the same map
    are one version, whatever the order or spelling of their checksum files' lines."""
    with package_root(path) as root:
        try:
            return parse_checksums((root / CHECKSUMS).read_bytes())
        except (OSError, CalctlError):
            return None


class RollbackRun:
    """One roll forward and back on ``device``; :meth:`run` returns what it did (:class:`RollbackOutcome`)."""

    def __init__(
        self,
        *,
        package: Path,
        previous: Path,
        device: DeviceSpec,
        trust: TrustPolicy,
        traffic_s: float,
        stage_timeout_s: float,
        log: Log = lambda line: None,
    ) -> None:
        self.package, self.previous = package, previous
        self.device, self.trust = device, trust
        self.traffic_s, self.stage_timeout_s = traffic_s, stage_timeout_s
        self.log = log
        self.stages: list[_Stage] = []
        self.problems: list[str] = []
        self.actions: list[dict[str, Any]] = []
        self._stage: _Stage | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._n = 0

    # -- traffic -----------------------------------------------------------------------------------

    def _request(self, alias: str, prompt: tuple[int, ...], max_tokens: int) -> GenerationRequest:
        with self._lock:
            self._n += 1
            n = self._n
        return GenerationRequest(
            f"rollback-{n}", alias, "accept-rollback", prompt, max_tokens, SamplingParams(temperature=0.0), None, True
        )

    async def _client(self, alias: str) -> None:
        while not self._stop.is_set():
            stage = self._stage
            res = await drive_engine_request(
                self.engine.submit,
                self._request(alias, PROMPT, MAX_TOKENS),
                ClientPlan("rollback-traffic"),
                timeout_s=self.stage_timeout_s,
            )
            if stage is not None:
                with self._lock:
                    stage.results.append(res)
            await asyncio.sleep(0.05 if res.record.outcome is REFUSED else 0.002)

    def _probe(self, stage: _Stage) -> None:
        for alias in self.sup.cores:
            res, tokens = self._probe_one(alias)
            with self._lock:
                stage.results.append(res)
            stage.probe[alias] = tokens
            if not res.record.ok:
                self.problems.append(
                    f"{stage.name}: the probe of {alias} ended {res.record.outcome.value}: {res.record.error}"
                )

    def _probe_one(self, alias: str) -> tuple[EngineResult, list[int]]:
        """The fixed greedy probe on ``alias``: its result and the token ids it delivered."""
        taps: list[TokenTap] = []

        def submit(req: GenerationRequest) -> TokenTap:
            taps.append(TokenTap(self.engine.submit(req)))
            return taps[-1]

        res = self.loop.submit(
            drive_engine_request(
                submit,
                self._request(alias, PROBE_PROMPT, PROBE_TOKENS),
                ClientPlan("rollback-probe"),
                timeout_s=self.stage_timeout_s,
            )
        ).result(self.stage_timeout_s + 10)
        return res, list(taps[0].tokens) if taps else []

    def _begin(self, name: str) -> _Stage:
        stage = _Stage(name, started=time.monotonic())
        self.stages.append(stage)
        self._stage = stage
        return stage

    def _end(self, stage: _Stage) -> None:
        stage.ended = time.monotonic()
        stage.serving_digest = self.sup.loaded.digest if self.sup.loaded else None
        stage.generations = {a: w.generation for a, w in self.sup.cores.items()}

    def _serve(self, name: str) -> _Stage:
        """A steady stage: the probe, then traffic until ``traffic_s`` passed and every alias served a request."""
        stage = self._begin(name)
        self._probe(stage)
        deadline = stage.started + self.stage_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                served = {r.record.alias for r in stage.results if r.record.ok}
            if time.monotonic() - stage.started >= self.traffic_s and served >= set(self.sup.cores):
                break
            time.sleep(0.02)
        else:
            missing = sorted(set(self.sup.cores) - served)
            self.problems.append(f"{name}: {', '.join(missing)} served no request in {self.stage_timeout_s:g} s")
        self._end(stage)
        return stage

    def _act(self, name: str, call: Callable[[], R]) -> R:
        stage = self._begin(name)
        self.log(f"  {name} under traffic")
        out = call()
        self._end(stage)
        self.actions.append(out.to_json())
        if not out.ok:
            self.problems.append(f"{name}: {out.detail}")
        return out

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> RollbackOutcome:
        want_prev, want_pkg = digest_of(self.previous), digest_of(self.package)
        if want_prev is not None and want_prev == want_pkg:
            raise SamePackage(f"--previous {self.previous} is the same package as PKG (digest {want_prev})")
        same = contents_of(self.previous)
        if same is not None and same == contents_of(self.package):
            raise SamePackage(
                f"--previous {self.previous} holds the same files as PKG (every sealed file's hash is PKG's; only "
                "its checksum file differs): no version change"
            )
        with self.device.open() as rt:
            with ServingStack(
                rt,
                trust=self.trust,
                name="accept-rollback",
                options=SupervisorOptions(warmup_iterations=1),
                shutdown_deadline_s=10.0,
            ) as stack:
                self.sup, self.engine = stack.sup, stack.engine
                self.log(f"  start with the previous version {self.previous}")
                stack.start(self.previous)
                gens = stack.generations()
                self.actions.append({"action": "start", "ok": True, "package": str(self.previous), "generations": gens})
                self.loop = loop = stack.loop
                clients = [loop.submit(self._client(a)) for a in stack.aliases for _ in range(CLIENTS_PER_ALIAS)]
                with contextlib.ExitStack() as on_failure:
                    # SIGINT/SIGTERM or a failure mid-stage: the clients stop and the engine ends within 5 s while
                    # the loop still runs, so the streams it aborts are delivered (never into a closed loop).
                    on_failure.callback(stack.close, deadline_s=5.0)
                    on_failure.callback(self._stop.set)  # callbacks run last-in first-out: the clients stop first
                    before = self._serve("serving-previous")
                    self._act("roll-forward", lambda: self.sup.reload(self.package))
                    forward = self._serve("serving-package")
                    back = self._act("rollback", self.sup.rollback)
                    after = self._serve("rolled-back")
                    on_failure.pop_all()  # served every stage: the clients finish below, the stack closes as usual
                self._stage = None
                self._stop.set()
                for f in clients:
                    f.result(self.stage_timeout_s + 10)
                ready = {a: w.is_ready() for a, w in self.sup.cores.items()}
        self._check(before, forward, after, back, ready, want_prev, want_pkg)
        return self._result(ready, want_prev, want_pkg)

    def _check(
        self,
        before: _Stage,
        forward: _Stage,
        after: _Stage,
        back: RollbackResult,
        ready: dict[str, bool],
        want_prev: str | None,
        want_pkg: str | None,
    ) -> None:
        p = self.problems
        expected = ((before, want_prev, "--previous"), (forward, want_pkg, "PKG"), (after, want_prev, "--previous"))
        for stage, want, what in expected:
            if stage.serving_digest != want:
                p.append(f"{stage.name}: served digest {stage.serving_digest}, expected {what}'s {want}")
        if back.ok and Path(str(back.package)).resolve() != Path(self.previous).resolve():
            p.append(f"rollback: went back to {back.package}, not to --previous {self.previous}")
        for alias in self.sup.cores:
            gens = [s.generations.get(alias) for s in (before, forward, after)]
            if not all(a is not None and b is not None and a < b for a, b in itertools.pairwise(gens)):
                p.append(f"{alias}: generations {gens} do not grow at each version change")
            if before.probe.get(alias) != after.probe.get(alias):
                p.append(
                    f"{alias}: the probe after the rollback gave {after.probe.get(alias)}, "
                    f"before the roll forward {before.probe.get(alias)}: not the old version's output"
                )
        for stage in self.stages:
            for r in stage.results:
                rec = r.record
                if not rec.ok and not (rec.outcome is REFUSED and not r.token_generations):
                    p.append(
                        f"{stage.name}: request {r.request_id} ({rec.alias}) ended {rec.outcome.value}: {rec.error}"
                    )
                if len(set(r.token_generations)) > 1:
                    p.append(
                        f"{stage.name}: request {r.request_id} ({rec.alias}) got tokens of generations "
                        f"{sorted({str(g) for g in r.token_generations})}"
                    )
        not_ready = sorted(a for a, ok in ready.items() if not ok)
        if not_ready:
            p.append(f"not Ready after the rollback: {', '.join(not_ready)}")

    def _result(self, ready: dict[str, bool], want_prev: str | None, want_pkg: str | None) -> RollbackOutcome:
        results = [r for s in self.stages for r in s.results]
        outcomes = Counter(r.record.outcome.value for r in results)
        changed = {a: self.stages[0].probe.get(a) != self._stage_named("serving-package").probe.get(a) for a in ready}
        return RollbackOutcome(
            previous=self.previous,
            package=self.package,
            digests={"previous": want_prev, "package": want_pkg},
            actions=tuple(self.actions),
            stages=tuple(self.stages),
            requests={"sent": len(results), **dict(sorted(outcomes.items()))},
            probe_changed_with_version=changed,
            ready_after=ready,
            problems=tuple(self.problems),
        )

    def _stage_named(self, name: str) -> _Stage:
        return next(s for s in self.stages if s.name == name)


__all__ = ["RollbackOutcome", "RollbackRun", "SamePackage", "digest_of"]
