"""``calctl_requests_total`` counts each request once, as its 001 §14 record says it ended (issue 49).

Every request has one record and one count, whatever ended it: served (length, stop), refused by the HTTP
layer, refused at admission (prompt plus ``max_tokens`` past the context: the scheduler ends a refused
request too, and that end used to be counted a second time), a model the server does not have (a record, no
metric label), cancelled by the client. The counters are read from the metrics registry, the records from
the flight recorder every server keeps (no ``--records`` needed).
"""

from __future__ import annotations

import collections
import time

import httpx

from tests.integration.serve_harness import Served, serving
from tests.waiting import wait_until


def _counts(served: Served) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = collections.Counter()
    for metric in served.supervisor.metrics.requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                out[(sample.labels["model"], sample.labels["outcome"])] += int(sample.value)
    return dict(out)


def _tokens(served: Served) -> dict[str, int]:
    """calctl_generated_tokens_total per model."""
    return {
        s.labels["model"]: int(s.value)
        for metric in served.supervisor.metrics.tokens.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


def _records(served: Served) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = collections.Counter()
    for rec, _ in served.supervisor.metrics.records.recent("request"):
        out[(rec["model_alias"], rec["error_class"] or rec["finish_reason"])] += 1
    return dict(out)


def test_every_request_is_counted_once_as_its_record_says() -> None:
    with serving(time_scale=0.05) as served:
        before_counts, before_records = _counts(served), _records(served)  # start-up's own (none expected)
        before_tokens = _tokens(served)
        sent = [
            ({"model": "model-a", "prompt": "Hello", "max_tokens": 3}, 200),
            ({"model": "model-b", "prompt": [5, 6, 7], "max_tokens": 2}, 200),
            ({"model": "model-a", "prompt": "Hello", "max_tokens": 1000}, 400),  # admission: past the context
            ({"model": "model-b", "prompt": [5] * 250, "max_tokens": 7}, 400),  # admission: 250 + 7 > 256
            ({"model": "model-a", "prompt": "Hello", "temperature": 9}, 400),  # the HTTP layer
            ({"model": "model-a", "prompt": [5, 99999]}, 400),  # past the vocabulary
            ({"model": "model-zzz", "prompt": "Hello"}, 404),  # a record, never a label
        ]
        with httpx.Client(timeout=60) as client:
            for body, status in sent:
                r = client.post(f"{served.v1}/completions", json=body)
                assert r.status_code == status, (body, r.text)
            # A streamed request the client leaves after its first token: cancelled.
            body = {"model": "model-a", "prompt": "Hello", "max_tokens": 200, "stream": True}
            served.slow_board(0.5)
            with client.stream("POST", f"{served.v1}/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break
        wait_until(lambda: not any(w.inflight() for w in served.supervisor.cores.values()), what="idle", timeout=60)
        time.sleep(0.3)
        counts = {k: v - before_counts.get(k, 0) for k, v in _counts(served).items()}
        records = {k: v - before_records.get(k, 0) for k, v in _records(served).items()}
        counts = {k: v for k, v in counts.items() if v}
        assert records.pop(("model-zzz", "model_not_found")) == 1
        assert counts == records, (counts, records)
        # Tokens delivered: the records' output tokens, model by model.
        out_tokens: dict[str, int] = collections.Counter()
        for rec, _ in served.supervisor.metrics.records.recent("request"):
            out_tokens[rec["model_alias"]] += rec["output_tokens"] or 0
        delivered = {m: n - before_tokens.get(m, 0) for m, n in _tokens(served).items()}
        assert delivered == {m: out_tokens.get(m, 0) for m in delivered}, (delivered, out_tokens)
        assert counts == {
            ("model-a", "length"): 1,
            ("model-b", "length"): 1,
            ("model-a", "invalid"): 3,
            ("model-b", "invalid"): 1,
            ("model-a", "cancelled"): 1,
        }, counts
