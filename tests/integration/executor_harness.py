"""The real serving engine in-process on the mock board, with one alias's executor configured, for the executor tests.

No HTTP: requests go through :class:`ServingEngine` on an :class:`EngineLoop`, and every delivered token id is
kept, so a test can check that nothing was delivered wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.runners.traffic import EngineLoop
from calctl.runtime import open_runtime
from calctl.runtime.mock import MockRuntime
from calctl.serving.config import DowngradePolicy, ExecutorConfig, ExecutorMode, default_scheduler_config
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.serving.engine.loop import EngineCore
from calctl.serving.protocol import EngineRejection, GenerationRequest, SamplingParams
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB
from tests.integration.serve_harness import golden

SINGLE = FIXTURE_PACKAGES / "single"
ALIAS = "model-a"
PROMPT, GOLDEN = golden(SINGLE, ALIAS)  # 22-token prompt, 16 greedy tokens (no EOS among them)


@dataclass
class Outcome:
    request_id: str
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    rejected: str | None = None

    @property
    def ok(self) -> bool:
        return self.finish in ("length", "stop") and self.error is None

    def delivered_right(self, reference: list[int] = GOLDEN) -> bool:
        """Every token delivered is the reference token at its position (a prefix of the greedy output)."""
        return self.tokens == reference[: len(self.tokens)]


@dataclass
class Harness:
    rt: MockRuntime
    supervisor: DeviceSupervisor
    engine: ServingEngine
    loop: EngineLoop

    @property
    def worker(self) -> EngineCore:
        return self.supervisor.cores[ALIAS]

    def request(self, request_id: str, max_tokens: int = len(GOLDEN)) -> GenerationRequest:
        """A greedy request for the golden prompt that ignores EOS."""
        return GenerationRequest(
            request_id, ALIAS, "tests", tuple(PROMPT), max_tokens, SamplingParams(temperature=0.0), ignore_eos=True
        )

    def run(self, n: int, max_tokens: int = len(GOLDEN), *, tag: str = "r", timeout_s: float = 60.0) -> list[Outcome]:
        """``n`` identical greedy requests at once; their outcomes in order."""
        reqs = [self.request(f"{tag}-{i}", max_tokens) for i in range(n)]
        return self.loop.submit(_gather(self.engine, reqs)).result(timeout_s)

    def metric(self, name: str, **labels: str) -> float | None:
        from prometheus_client.parser import text_string_to_metric_families

        for fam in text_string_to_metric_families(self.engine.metrics_text().decode()):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return None


async def _one(engine: ServingEngine, req: GenerationRequest) -> Outcome:
    out = Outcome(req.request_id)
    try:
        stream = engine.submit(req)
        await stream.admitted()
    except EngineRejection as exc:
        out.rejected = exc.code.value
        return out
    async for ev in stream:
        if ev.finish is not None:
            out.finish, out.error = ev.finish.value, ev.error
            break
        if ev.token_id is not None:
            out.tokens.append(ev.token_id)
    return out


async def _gather(engine: ServingEngine, reqs: list[GenerationRequest]) -> list[Outcome]:
    return list(await asyncio.gather(*(_one(engine, r) for r in reqs)))


@contextlib.contextmanager
def executor_engine(
    mode: ExecutorMode = ExecutorMode.PINGPONG,
    *,
    max_inflight: int = 2,
    fixed_engine: bool = False,
    time_scale: float = 1.0,
    downgrade: DowngradePolicy | None = None,
    job_timeout_s: float = 10.0,
    mock: dict[str, Any] | None = None,
    package: Path = SINGLE,
) -> Iterator[Harness]:
    cfg = dataclasses.replace(
        default_scheduler_config(ALIAS, max_inflight=max_inflight),
        executor=ExecutorConfig(max_inflight, fixed_engine, mode, downgrade or DowngradePolicy()),
    )
    with open_runtime("mock", time_scale=time_scale, **(mock or {})) as rt:
        assert isinstance(rt, MockRuntime)
        sup = DeviceSupervisor(
            rt,
            trust=make_policy([TEST_PUB]),
            scheduler_configs={ALIAS: cfg},
            options=SupervisorOptions(warmup_iterations=1, job_timeout_s=job_timeout_s),
        )
        try:
            sup.start(package)
            with EngineLoop("executor-tests") as loop:
                yield Harness(rt, sup, ServingEngine(sup), loop)
        finally:
            sup.shutdown(5.0)
