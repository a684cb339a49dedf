"""calctl bench --dataset and --sweep: the file layouts, their refusals, the request bodies and the knee rule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from calctl.checks.stats import percentiles
from calctl.errors import UsageError
from calctl.loadgen.dataset import dataset_workload, load_dataset
from calctl.loadgen.http import request_body
from calctl.loadgen.metrics import ModelStats
from calctl.loadgen.workload import LengthDist, PlannedRequest
from calctl.runners.bench.sweep import MIN_SAMPLES, SweepLevel, find_knee, parse_levels


def _write(tmp_path: Path, text: str, name: str = "d.jsonl") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_jsonl_prompts_ids_and_chats(tmp_path: Path) -> None:
    ds = load_dataset(
        _write(
            tmp_path,
            '{"prompt": "hi", "max_tokens": 3}\n\n{"prompt": [1, 2], "output_len": 4}\n'
            '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}]}\n',
        )
    )
    assert ds.layout == "jsonl" and len(ds.entries) == 3
    text, ids, chat = ds.entries
    assert text.text == "hi" and text.output_len == 3
    assert ids.prompt_ids == (1, 2) and ids.output_len == 4
    assert chat.messages == (("system", "be brief"), ("user", "why?")) and chat.output_len is None
    assert ds.document()["chats"] == 1


def test_sharegpt_takes_the_first_exchange_and_skips_entries_without_one(tmp_path: Path) -> None:
    doc = [
        {"id": "a", "conversations": [{"from": "human", "value": "Tell me"}, {"from": "gpt", "value": "x" * 40}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "no question"}]},
        {"id": "c", "conversations": "not a list"},
        {"id": "d", "conversations": [{"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}]},
    ]
    ds = load_dataset(_write(tmp_path, json.dumps(doc), "share.json"))
    assert ds.layout == "sharegpt" and ds.skipped == 2
    assert [(e.text, e.output_len) for e in ds.entries] == [("Tell me", 10), ("Q", 1)]  # characters / 4, at least 1


def test_a_timed_trace_keeps_its_offsets_within_the_duration(tmp_path: Path) -> None:
    ds = load_dataset(
        _write(
            tmp_path,
            '{"prompt": "a", "timestamp": 100.5}\n{"prompt": "b", "timestamp": 100.0}\n{"prompt": "c", "timestamp": 109}\n',
        )
    )
    assert ds.layout == "trace"
    wl = dataset_workload(ds, seed=0, stream=0, rate=1.0, duration_s=5.0, burstiness=1.0, output=None, max_requests=9)
    assert [(r.offset_s, r.text) for r in wl] == [(0.0, "b"), (0.5, "a")]  # c at 9 s is past the 5 s phase
    assert all(r.max_tokens == 128 for r in wl)  # no length in the file, none given


def test_output_len_overrides_the_files_lengths_and_prompts_cycle(tmp_path: Path) -> None:
    ds = load_dataset(_write(tmp_path, '{"prompt": "a", "max_tokens": 3}\n{"prompt": "b", "max_tokens": 3}\n'))
    wl = dataset_workload(
        ds, seed=1, stream=0, rate=50.0, duration_s=1.0, burstiness=1.0, output=LengthDist.parse("7"), max_requests=9
    )
    assert len(wl) == 9 and {r.max_tokens for r in wl} == {7} and {r.text for r in wl} == {"a", "b"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"prompt": "a", "messages": []}\n', "exactly one of 'prompt' and 'messages'"),
        ('{"max_tokens": 3}\n', "exactly one of 'prompt' and 'messages'"),
        ('{"prompt": ""}\n', "'prompt' is empty"),
        ('{"prompt": "a", "max_tokens": 0}\n', "'max_tokens' must be an integer from 1"),
        ('{"prompt": "a", "max_tokens": true}\n', "'max_tokens' must be an integer"),
        ('{"prompt": "a", "max_tokens": 1e9}\n', "'max_tokens' must be an integer"),
        ('{"prompt": [1, -2]}\n', "'prompt' must be an integer from 0"),
        ('{"prompt": "a", "timestamp": -1}\n', "'timestamp' must be a finite number"),
        ('{"prompt": "a", "timestamp": 1}\n{"prompt": "b"}\n', "1 of 2 lines have a timestamp"),
        ('{"messages": [{"role": "user"}]}\n', "messages[0] must be"),
        ('["a"]\n', "no usable prompt (1 entries skipped)"),
        ("{not json\n", "line 1 is not JSON"),
        ('"just a string"\n', "line 1: expected a JSON object"),
        ('{"prompt": "\\ud800"}\n', "not a Unicode character (a lone surrogate)"),
        ('{"messages": [{"role": "us\\udfffer", "content": "x"}]}\n', "messages[0].role"),
        ("\n\n", "no usable prompt"),
    ],
)
def test_bad_lines_are_usage_errors_naming_file_line_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        load_dataset(path)
    assert needle in str(e.value) and str(path) in str(e.value), str(e.value)


def test_hostile_files_are_refused_in_bounded_time(tmp_path: Path) -> None:
    deep = _write(tmp_path, '{"prompt": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(UsageError, match="line 1: nested at least 100001 levels deep, more than the 64"):
        load_dataset(deep)
    with pytest.raises(UsageError, match="not a regular file"):
        load_dataset(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        load_dataset(fifo)  # never opened: a FIFO would block the read
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(UsageError, match="not UTF-8"):
        load_dataset(bad)
    with pytest.raises(UsageError, match="No such file"):
        load_dataset(tmp_path / "missing.jsonl")


def test_request_bodies_go_to_the_endpoint_of_their_prompt() -> None:
    path, body = request_body("m", PlannedRequest(0.0, (), 5, messages=(("user", "hi"),)), 0.0, 7)
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and "prompt" not in body
    path, body = request_body("m", PlannedRequest(0.0, (), 5, text="hello"), 0.0, 7)
    assert path == "/v1/completions" and body["prompt"] == "hello"
    path, body = request_body("m", PlannedRequest(0.0, (4, 5), 5), 1.0, 7)
    assert path == "/v1/completions" and body["prompt"] == [4, 5] and body["seed"] == 7


def _level(
    level: float, tokens_per_s: float, ttft_p99: float, *, n: int = MIN_SAMPLES, ok: int | None = None
) -> SweepLevel:
    ttfts = [ttft_p99] * n
    stats = ModelStats(
        alias="m",
        requests=n,
        succeeded=n if ok is None else ok,
        outcomes={},
        ttft=percentiles(ttfts),
        tpot=percentiles([0.01] * n),
        itl=percentiles([]),
        e2e=percentiles([]),
        completion_tokens=0,
        wall_s=1.0,
        tokens_per_s=tokens_per_s,
        requests_per_s=None,
        goodput_rps=None,
        slo_attainment=None,
    )
    return SweepLevel(level, stats, n, ())


def test_the_knee_against_slos_is_the_highest_level_within_them() -> None:
    levels = [_level(1, 100, 0.05), _level(2, 190, 0.08), _level(4, 260, 0.4), _level(8, 270, 2.0)]
    knee = find_knee(levels, slo_ttft=0.5, slo_tpot=None)
    assert knee.level == 4 and "at 8 P99 TTFT 2000.0 ms > 500.0 ms" in knee.reason
    assert find_knee(levels, slo_ttft=0.01, slo_tpot=None).level is None
    # a level where requests failed is never within the SLOs
    failing = [_level(1, 100, 0.05), _level(2, 190, 0.08, ok=MIN_SAMPLES - 3)]
    knee = find_knee(failing, slo_ttft=0.5, slo_tpot=None)
    assert knee.level == 1 and "did not succeed" in knee.reason


def test_the_knee_without_slos_is_where_throughput_stops_growing_and_latency_rises() -> None:
    levels = [_level(1, 100, 0.05), _level(2, 190, 0.06), _level(4, 200, 0.3), _level(8, 201, 1.2)]
    knee = find_knee(levels, slo_ttft=None, slo_tpot=None)
    assert knee.level == 2 and "under 10% more" in knee.reason
    growing = [_level(1, 100, 0.05), _level(2, 190, 0.06)]
    assert find_knee(growing, slo_ttft=None, slo_tpot=None).level is None


def test_levels_with_too_few_samples_are_never_the_knee() -> None:
    levels = [_level(1, 100, 0.05, n=MIN_SAMPLES - 1), _level(2, 190, 0.06, n=MIN_SAMPLES - 1)]
    knee = find_knee(levels, slo_ttft=1.0, slo_tpot=None)
    assert knee.level is None and "lengthen --duration" in knee.reason


def test_sweep_levels_are_checked() -> None:
    assert parse_levels(None, "rate") == (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
    assert parse_levels("1,3,9", "concurrency") == (1.0, 3.0, 9.0)
    for spec in ("", "2,1", "0,1", "1,x", "1.5,2", ",".join(str(i) for i in range(1, 20)), "nan,1"):
        with pytest.raises(UsageError):
            parse_levels(spec, "concurrency")


def test_a_level_where_every_request_was_refused_names_the_refusals_not_the_duration() -> None:
    refused = _level(1, 0.0, 0.0, n=0)
    stats = refused.stats.__class__(**{**refused.stats.__dict__, "requests": 87, "outcomes": {"invalid": 87}})
    knee = find_knee([SweepLevel(1, stats, 87, ())], slo_ttft=None, slo_tpot=None)
    assert knee.level is None and "87 x 400 (invalid)" in knee.reason and "not a load problem" in knee.reason
    assert "every request refused at every level" in knee.reason


def _refused_level(level: float, outcome: str, n: int = 30) -> SweepLevel:
    empty = _level(level, 0.0, 0.0, n=0)
    stats = empty.stats.__class__(**{**empty.stats.__dict__, "requests": n, "outcomes": {outcome: n}})
    return SweepLevel(level, stats, n, ())


def test_a_level_the_server_refused_outright_is_no_reason_to_extend_the_sweep() -> None:
    """Throughput still growing at the last served level used to read "extend --sweep-levels" even when the next
    level was refused outright; 429s there are the server's admission limits, 503s or 400s no load figure."""
    served = [_level(1, 100, 0.05), _level(2, 190, 0.06)]
    knee = find_knee([*served, _refused_level(4, "capacity")], slo_ttft=None, slo_tpot=None)
    assert knee.level == 2 and "every request refused: 30 x 429 (capacity)" in knee.reason, knee
    assert "admission limits" in knee.reason and "extend" not in knee.reason
    knee = find_knee([*served, _refused_level(4, "unavailable")], slo_ttft=None, slo_tpot=None)
    assert knee.level is None and "30 x 503 (unavailable): not a load problem" in knee.reason, knee
    assert find_knee(served, slo_ttft=None, slo_tpot=None).reason.endswith("extend --sweep-levels")


def test_a_sweep_over_a_timed_trace_is_refused_before_any_request(tmp_path: Path) -> None:
    from calctl.runners.bench.base import BenchOptions
    from calctl.runners.bench.sweep import run_sweep

    trace = load_dataset(_write(tmp_path, '{"prompt": "a", "timestamp": 0}\n{"prompt": "b", "timestamp": 1}\n'))
    opts = BenchOptions(tmp_path, url="http://127.0.0.1:1", models=("m",), sweep="rate", dataset=trace)
    with pytest.raises(UsageError, match="is a timed trace: its timestamps fix the arrivals"):
        run_sweep(opts, lambda _: None)


def _sharegpt(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    return path


def test_a_jsonl_line_of_millions_of_values_is_refused_naming_line_and_limit(tmp_path: Path) -> None:
    """Issue 54: json.loads built every value of a line (up to 256 MiB of them) before any check."""
    path = _write(tmp_path, '{"prompt": "a"}\n{"prompt": "b", "x": [' + ",".join(["0"] * 1_100_000) + "]}\n")
    with pytest.raises(UsageError, match=r"line 2: at least 1,\d{3},\d{3} values, more than the 1,004,096"):
        load_dataset(path)


def test_a_sharegpt_conversation_of_millions_of_turns_is_refused_naming_the_part(tmp_path: Path) -> None:
    turns = ",".join(['{"from":"human","value":"q"}'] * 1_100_000)
    path = _sharegpt(tmp_path, '[{"conversations": [' + turns + "]}]")
    with pytest.raises(UsageError, match=r"under key 'conversations' holds at least .* entries, more than 65,536"):
        load_dataset(path)


def test_a_sharegpt_file_nested_deep_or_broken_is_refused_naming_the_entry_or_limit(tmp_path: Path) -> None:
    ok = '{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}'
    deep = _sharegpt(tmp_path, "[" + ok + ', {"x": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    with pytest.raises(UsageError, match="levels deep, more than the 64"):
        load_dataset(deep)
    broken = _sharegpt(tmp_path, "[" + ok + ", " + ok + ', {"conversations": nope}]')
    with pytest.raises(UsageError, match="entry 2 is not JSON"):
        load_dataset(broken)
    trailing = _sharegpt(tmp_path, "[" + ok + "] [1]")
    with pytest.raises(UsageError, match="one JSON array"):
        load_dataset(trailing)


def test_a_sharegpt_file_is_read_entry_by_entry_with_the_same_result(tmp_path: Path) -> None:
    """Strings holding commas and brackets do not split an entry; skipped entries are counted as before."""
    entries = [
        {"conversations": [{"from": "human", "value": f"q{i}, [x] {{y}}"}, {"from": "gpt", "value": "a" * 40}]}
        for i in range(50)
    ] + [{"conversations": [{"from": "human", "value": "alone"}]}]
    import json as _json

    ds = load_dataset(_sharegpt(tmp_path, _json.dumps(entries, indent=2)))
    assert ds.layout == "sharegpt" and ds.skipped == 1 and len(ds.entries) == 50
    assert ds.entries[7].text == "q7, [x] {y}" and ds.entries[7].output_len == 10


def test_a_closed_loop_of_n_clients_runs_n_tasks_whatever_it_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """A concurrency level plans up to 10,000 requests, all at offset 0: one task each took a loaded host longer
    to start than a 1.5 s level lasts, and the level sent nothing. N clients are N tasks sharing the plan, in
    plan order, each sending its next request once its last one ended; none sends after the level's time."""
    import asyncio
    import time

    from calctl.loadgen import http

    seen: list[int] = []
    in_flight: list[int] = [0, 0]

    async def fake_stream(client: object, target: object, path: str, body: dict, rec: http.RequestRecord) -> None:
        seen.append(len(asyncio.all_tasks()))
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        await asyncio.sleep(0.002)
        in_flight[0] -= 1
        rec.status, rec.finish, rec.end = 200, "stop", time.monotonic()
        rec.outcome = http.RequestOutcome.OK

    monkeypatch.setattr(http, "_stream", fake_stream)
    planned = [PlannedRequest(0.0, (5, 6, 7), i + 1) for i in range(10_000)]  # max_tokens: the plan's order
    phase = http.run_phase(
        http.HttpTarget("http://127.0.0.1:9"), {"m": planned}, label="c2", duration_s=0.3, grace_s=5.0, seed=1,
        max_concurrency=2,
    )  # fmt: skip
    assert phase.records and len(phase.records) < len(planned)  # sent for 0.3 s, then stopped
    # the phase's own task, its two clients and each one's wait_for task: never a task per planned request
    assert max(seen) <= 5, max(seen)
    assert in_flight[1] == 2  # both clients sent at once, never more
    assert all(r.outcome is http.RequestOutcome.OK for r in phase.records)
    assert max(r.sent for r in phase.records) < phase.t0 + 0.3  # nothing sent after the level's time
    sent = sorted(r.max_tokens for r in phase.records)
    assert sent == list(range(1, len(sent) + 1))  # the plan's first requests, none skipped
