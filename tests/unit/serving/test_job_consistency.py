"""000 §7.4: a finished job's generation, lanes and graph are checked against what was submitted, never assumed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.types import Engine, GenerationId, Job, JobId, JobResult, JobState, KvSeqId
from calctl.serving.engine.job_checks import status_anomaly

SUBMITTED = Job(
    id=JobId(7),
    graph="model_a_decode",
    model="model-a",
    chips=(0,),
    engine=Engine.AUTO,
    generation=GenerationId(3),
    batch=1,
    kv=(KvSeqId(11),),
    submit_ns=1,
)


def _answer(**changes: Any) -> JobResult:
    return JobResult(dataclasses.replace(SUBMITTED, **changes), JobState.SUCCEEDED, RuntimeStatus.OK, 1, 2)


def test_the_submitted_job_is_consistent() -> None:
    assert status_anomaly(SUBMITTED, _answer()) is None


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"generation": GenerationId(2)}, "generation 2, submitted under 3"),
        ({"kv": (KvSeqId(12),)}, "KV lanes"),
        ({"batch": 2, "kv": (KvSeqId(11), KvSeqId(12))}, "KV lanes"),
        ({"graph": "model_b_decode"}, "submitted as model-a/model_a_decode"),
    ],
)
def test_a_finished_job_that_differs_from_the_submitted_one_is_an_anomaly(changes: dict[str, Any], needle: str) -> None:
    got = status_anomaly(SUBMITTED, _answer(**changes))
    assert got is not None and needle in got, got
