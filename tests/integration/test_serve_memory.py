"""Serving keeps memory flat over requests (issue 32): a finished request leaves no KV cache behind.

The mock board used to keep every finished job's record, its KV sequence and cache included, for its
last 65,536 jobs: about one KV cache per request (89 MB for SmolLM2 at context 2048). This pins the
mechanism on the tiny fixture model, in-process, by counting the live caches; the 500-request RSS
figure on the real model is a measurement (docs/serve.md), not a timed test.
"""

from __future__ import annotations

import gc

import httpx

from calctl.model.decoder import KvCache
from calctl.runtime.mock.kv import KvSequence
from tests.integration.serve_harness import COMBINED, serving


def _live(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, cls))


def test_a_few_hundred_requests_leave_no_kv_cache_behind() -> None:
    with serving(COMBINED, time_scale=0.0) as served:
        with httpx.Client(base_url=served.v1, timeout=60) as client:

            def ask(n: int) -> None:
                for i in range(n):
                    body = {
                        "model": ("model-a", "model-b")[i % 2],
                        "messages": [{"role": "user", "content": f"request {i}"}],
                        "max_tokens": 4,
                        "temperature": 0,
                    }
                    r = client.post("/chat/completions", json=body)
                    assert r.status_code == 200, r.text

            ask(10)
            before = _live(KvCache), _live(KvSequence)
            ask(300)
            after = _live(KvCache), _live(KvSequence)
        lanes = sum(served.rt.current_calbin.package.model(a).kv.max_sequences for a in ("model-a", "model-b"))
        # At most the lanes' sequences can be live; 300 requests used to leave 300 more caches.
        assert after[0] <= max(before[0], lanes) and after[1] <= max(before[1], lanes), (before, after)
        assert served.rt._jobs == {}  # the board holds no finished job's record
