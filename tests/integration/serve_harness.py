"""Start the real serving engine on the mock board behind uvicorn, in-process, for tests."""

from __future__ import annotations

import contextlib
import dataclasses
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calctl.runtime import open_runtime
from calctl.serving.api.app import create_app
from calctl.serving.api.auth import ApiSettings
from calctl.serving.config import load_dual_model_config
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB
from tests.unit.serving_api.api_harness import ServerThread

COMBINED = FIXTURE_PACKAGES / "combined"


@dataclass
class Served:
    url: str
    engine: ServingEngine
    supervisor: DeviceSupervisor
    rt: Any

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    def slow_board(self, time_scale: float) -> None:
        """Model every job submitted from now on at ``time_scale`` (the mock reads its config at each submit):
        a test that needs slow jobs starts at the default scale, so start-up's warm-up stays quick."""
        self.rt.config = dataclasses.replace(self.rt.config, time_scale=time_scale)


def dual_config(tmp: Path, *, a_waiting: int = 64, b_waiting: int = 64, pkg: Path = COMBINED) -> Path:
    path = tmp / "dual.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        schema: calculet-dual-model/v1
        device: {{type: pcie, expected_chips: 2, combined_calbin: {pkg}}}
        models:
          - {{alias: model-a, chip_id: 0, prefill_graph: model_a_prefill, decode_graph: model_a_decode,
              context_limit: 256, max_inflight: 1, max_waiting_requests: {a_waiting}}}
          - {{alias: model-b, chip_id: 1, prefill_graph: model_b_prefill, decode_graph: model_b_decode,
              context_limit: 256, max_inflight: 1, max_waiting_requests: {b_waiting}}}
        recovery: {{allow_session_reset: false, restart_process_on_unknown_dma: true}}
        """)
    )
    return path


@contextlib.contextmanager
def serving(
    pkg: Path = COMBINED,
    *,
    config: Path | None = None,
    time_scale: float = 0.05,
    fault_plan: Path | None = None,
    api_keys: dict[str, str] | None = None,
    warmup_iterations: int = 1,
    drain_deadline_s: float = 10.0,
    job_timeout_s: float = 10.0,
    runtime_options: dict[str, Any] | None = None,
    max_body_bytes: int | None = None,
) -> Iterator[Served]:
    opts: dict[str, Any] = {"time_scale": time_scale, **(runtime_options or {})}
    if fault_plan is not None:
        opts["fault_plan"] = fault_plan
    with open_runtime("mock", **opts) as rt:
        sup = DeviceSupervisor(
            rt,
            trust=make_policy([TEST_PUB]),
            dual_config=load_dual_model_config(config) if config else None,
            options=SupervisorOptions(
                warmup_iterations=warmup_iterations, drain_deadline_s=drain_deadline_s, job_timeout_s=job_timeout_s
            ),
        )
        try:
            sup.start(pkg)
            engine = ServingEngine(sup)
            settings = ApiSettings(api_keys=api_keys or {})
            if max_body_bytes is not None:
                settings = dataclasses.replace(settings, max_body_bytes=max_body_bytes)
            app = create_app(engine, settings)
            with ServerThread(app) as server:
                yield Served(server.base_url, engine, sup, rt)
        finally:
            sup.shutdown(2.0)


def golden(pkg: Path, alias: str) -> tuple[list[int], list[int]]:
    from calctl.package.reader import load_manifest

    m = load_manifest(pkg).model(alias)
    prompt = np.load(pkg / m.golden.prompt.file)[0].tolist()
    tokens = np.load(pkg / m.golden.decode_tokens.file).tolist()
    return prompt, tokens
