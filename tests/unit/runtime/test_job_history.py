"""The history of finished jobs is bounded by host memory, not only by count (issue 49, issue 53 item 4).

The mock kept its last 65,536 finished jobs, ~1.36 KB each (~85 MiB when full), with no other bound: a fresh
server grew ~80 MB before levelling off. ``history_bytes`` (``$CALCTL_JOB_HISTORY_MIB``) bounds it
(calctl/runtime/history.py). These tests run real jobs on the mock, check that the kept history stops at the
ceiling with ``wait``/``query``/``trace`` consistent with it, and hold the byte estimate against what
``tracemalloc`` sees.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from calctl.errors import ConfigError
from calctl.runtime.history import MIB, history_bytes_from_env
from calctl.runtime.mock import MockRuntime, open_mock
from calctl.runtime.types import Job
from tests.unit.runtime.runtime_helpers import package, prefill_job

PKG = package("single")


def _jobs(rt: MockRuntime, n: int) -> list[Job]:
    jobs = []
    for _ in range(n):
        job, seq, inputs, outputs = prefill_job(rt, PKG, "model-a")
        rt.wait(job, 10)
        rt.kv.free(seq)
        rt.release_buffer(inputs)
        rt.release_buffer(outputs)
        jobs.append(job)
    return jobs


def test_the_history_stops_at_its_bytes_and_wait_query_trace_agree_with_it() -> None:
    with open_mock(time_scale=0.0, history_bytes=MIB) as rt:
        rt.configure(rt.create_calbin(PKG))
        first = _jobs(rt, 200)
        use = rt.job_history()
        assert not use.full and use.jobs == 200 and 0 < use.bytes < MIB
        per_job = use.bytes / use.jobs
        jobs = first + _jobs(rt, int(1.5 * MIB / per_job))
        use = rt.job_history()
        assert use.full and use.bytes <= MIB and use.bytes > MIB - 2 * per_job, use
        assert len(rt.trace()) == use.events == use.jobs  # single-chip jobs: one event each
        kept = jobs[-use.jobs :]
        assert [e.job for e in rt.trace()] == [j.id for j in kept]
        assert rt.query(kept[0]).ok and rt.wait(kept[-1], 0).ok
        with pytest.raises(Exception, match="older than the history of finished jobs it keeps"):
            rt.query(jobs[0])


def test_the_estimate_is_within_a_quarter_of_what_tracemalloc_sees() -> None:
    with open_mock(time_scale=0.0, history_bytes=64 * MIB) as rt:
        rt.configure(rt.create_calbin(PKG))
        _jobs(rt, 50)  # first jobs build caches of their own (plans, kernels), not the history's
        gc.collect()
        tracemalloc.start()
        try:
            before, est0 = tracemalloc.get_traced_memory()[0], rt.job_history().bytes
            _jobs(rt, 1500)
            gc.collect()
            after, est1 = tracemalloc.get_traced_memory()[0], rt.job_history().bytes
        finally:
            tracemalloc.stop()
        measured, estimated = after - before, est1 - est0
        assert 0.75 * measured <= estimated <= 1.25 * measured, (measured / 1500, estimated / 1500)


def test_the_ceiling_comes_from_the_environment_and_a_bad_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_JOB_HISTORY_MIB", "3")
    assert history_bytes_from_env() == 3 * MIB
    with open_mock() as rt:
        assert rt.job_history().ceiling_bytes == 3 * MIB
    for bad in ("0", "lots", "nan", "-4"):
        monkeypatch.setenv("CALCTL_JOB_HISTORY_MIB", bad)
        with pytest.raises(ConfigError, match=f"CALCTL_JOB_HISTORY_MIB='{bad}'.*number from 1 to"):
            history_bytes_from_env()
    with pytest.raises(ConfigError, match="history_bytes must be >= 1 MiB"):
        open_mock(history_bytes=1000)
