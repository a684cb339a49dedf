"""An unload past its drain deadline follows 001 §11.1 and leaves no Unknown lane behind (issue 49, 000 §12).

001 §11.1: Draining -> Unloading only at zero in flight; Draining -> Recovering at the deadline. The history
used to read Draining -> Unloading -> Recovering -> Unloaded (Unloading shown while a hung job was still in
flight), and the unloaded model kept ``calctl_kv_lanes{state="Unknown"} 1`` until the next load although the
unload had freed every sequence.
"""

from __future__ import annotations

import threading
import time

import httpx

from calctl.runtime.mock.faults import FaultKind, FaultRule
from tests.integration.serve_harness import Served, serving
from tests.waiting import wait_until


def _ask(served: Served, out: dict[str, int], max_tokens: int = 8) -> threading.Thread:
    def run() -> None:
        body = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        with httpx.Client(base_url=served.v1, timeout=60) as client:
            out["status"] = client.post("/chat/completions", json=body).status_code

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _unknown_lanes(served: Served) -> list[str]:
    text = httpx.get(f"{served.url}/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith("calctl_kv_lanes") and 'state="Unknown"' in line]


def test_an_unload_with_a_hung_job_goes_recovering_then_unloading_and_frees_its_lanes() -> None:
    with serving(time_scale=0.0, drain_deadline_s=0.5, job_timeout_s=60.0) as served:
        served.rt.arm_fault(FaultRule(FaultKind.WAIT_TIMEOUT, at=(1,), graph="model_a_decode"))
        out: dict[str, int] = {}
        asking = _ask(served, out)
        core = served.supervisor.cores["model-a"]
        wait_until(lambda: core.inflight() > 0, timeout=30, what="model-a's decode job in flight (hung)")
        h0 = len(served.supervisor.history)
        result = served.supervisor.unload()
        assert result.ok and result.drained_in_time is False, result
        states = [e.state for e in served.supervisor.history[h0:] if e.alias == "model-a"]
        asking.join(30)
        assert out.get("status") == 503, out
        assert (states, _unknown_lanes(served)) == (["Draining", "Recovering", "Unloading", "Unloaded"], [])
        assert served.supervisor.load().ok


def test_an_unload_that_fails_a_running_request_between_jobs_leaves_no_unknown_lane() -> None:
    with serving(time_scale=0.05, drain_deadline_s=0.3) as served:
        served.slow_board(20.0)  # a request outlives the drain deadline, its jobs short enough to end
        out: dict[str, int] = {}
        # 64 tokens of 64 ms decode jobs: ~4 s on the board's own clock. At 8 tokens (~0.55 s) a loaded host's
        # late start of the unload (8 CPU burners beside the suite) let the request finish inside the deadline.
        asking = _ask(served, out, max_tokens=64)
        wait_until(lambda: served.supervisor.cores["model-a"].live_requests() > 0, timeout=30, what="a request")
        time.sleep(0.2)
        h0 = len(served.supervisor.history)
        result = served.supervisor.unload()
        assert result.ok and result.drained_in_time is False, result
        states = [e.state for e in served.supervisor.history[h0:] if e.alias == "model-a"]
        asking.join(30)
        assert _unknown_lanes(served) == []
        assert states[0] == "Draining" and states[-2:] == ["Unloading", "Unloaded"], states
