"""Several ``calctl serve`` processes (one mock board each) behind a real nginx, on loopback.

Used by tests/integration/test_multiboard_nginx.py and benchmarks/bench_multiboard.py.

* :func:`boards` starts ``python -m calctl serve`` subprocesses, each with its own
  ``CALCTL_BOARD_ID`` / ``CALCTL_MOCK_SEED``, bound to 127.0.0.1 on free ports,
  and waits for ``/health/ready``;
* :func:`nginx_front` runs nginx as a non-daemon child with the configuration
  block of docs/deploy.md §3 (only the upstream ports and the listen address
  are substituted), its pid, logs and temp paths in a private directory;
* :class:`LoadClient` sends streaming and non-streaming completions from a few
  threads, bounded in count and time, and records every outcome;
* every process is stopped on every path (context managers with ``finally``;
  each child leads its own process group, which is killed if it does not stop).

Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.waiting import wait_http_ready, wait_until

REPO = Path(__file__).resolve().parents[2]
DEPLOY_DOC = REPO / "docs" / "deploy.md"
COMBINED = REPO / "fixtures" / "packages" / "combined"
TEST_PUB = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"
BEGIN, END = "<!-- tested-nginx-begin -->", "<!-- tested-nginx-end -->"
MODELS = ("model-a", "model-b")


def find_nginx() -> str | None:
    """The nginx binary, also where root's PATH has it but a user's may not (/usr/sbin)."""
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
    """Signal ``proc`` and wait; past ``timeout`` kill its whole process group. The exit code, None if killed."""
    if proc.poll() is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        # Not reaped yet, so the group id cannot have been reused: the child leads its own group (start_new_session).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        return None


# ---------------------------------------------------------------------------- boards


@dataclass
class Backend:
    board: str
    seed: int
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text

    def requests_finished(self) -> float:
        """Sum of ``calctl_requests_total`` over models and outcomes."""
        return sum(
            float(m.group(1)) for m in re.finditer(r"^calctl_requests_total\{[^}]*\} (\S+)$", self.metrics(), re.M)
        )

    def live_requests(self) -> float:
        """Requests the board holds now: KV lanes not Free (admitted) plus requests waiting for admission."""
        text = self.metrics()
        lanes = sum(
            float(m.group(2))
            for m in re.finditer(r'^calctl_kv_lanes\{[^}]*state="(\w+)"[^}]*\} (\S+)$', text, re.M)
            if m.group(1) != "Free"
        )
        waiting = sum(float(m.group(1)) for m in re.finditer(r"^calctl_waiting_requests\{[^}]*\} (\S+)$", text, re.M))
        return lanes + waiting

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _wait_ready(backends: list[Backend], timeout: float) -> None:
    """Every board's ``/health/ready`` answers 200 (one shared deadline: the boards start in parallel)."""
    end = time.monotonic() + timeout
    for b in backends:
        wait_http_ready(
            b.url,
            b.proc,
            log=b.log,
            timeout=max(0.0, end - time.monotonic()),
            what=f"calctl serve for {b.board}",
            interval=0.1,
        )


@contextlib.contextmanager
def boards(
    workdir: Path,
    specs: list[tuple[str, int]],
    *,
    time_scale: float,
    drain_timeout: float,
    ready_timeout: float = 90.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[list[Backend]]:
    """One ``calctl serve`` per ``(board id, seed)``; all stopped (and killed if need be) on exit."""
    started: list[Backend] = []
    try:
        for board, seed in specs:
            port = free_port()
            log = workdir / f"serve-{board}.log"
            env = {**os.environ, "CALCTL_BOARD_ID": board, "CALCTL_MOCK_SEED": str(seed), "PYTHONUNBUFFERED": "1"}
            cmd = [
                sys.executable,
                "-m",
                "calctl",
                "serve",
                str(COMBINED),
                "--trusted-key",
                str(TEST_PUB),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--time-scale",
                str(time_scale),
                "--warmup-iterations",
                "1",
                "--drain-timeout",
                str(drain_timeout),
                "--log-level",
                "warning",
                *extra_args,
            ]
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=REPO,
                    start_new_session=True,
                )
            started.append(Backend(board, seed, port, proc, log))
        _wait_ready(started, ready_timeout)
        yield started
    finally:
        for b in started:
            stop_process(b.proc, signal.SIGTERM, timeout=drain_timeout + 10)


# ---------------------------------------------------------------------------- nginx


def documented_nginx_block() -> str:
    """The tested nginx configuration of docs/deploy.md §3 (the fenced block between the markers)."""
    text = DEPLOY_DOC.read_text()
    start, stop = text.index(BEGIN), text.index(END)
    block = text[start + len(BEGIN) : stop]
    m = re.search(r"```nginx\n(.*?)```", block, re.S)
    if m is None:
        raise AssertionError(f"{DEPLOY_DOC}: no ```nginx block between {BEGIN} and {END}")
    return m.group(1)


def render_nginx(block: str, listen_port: int, upstreams: list[str]) -> str:
    """Substitute the upstream servers (in order) and the listen address; nothing else changes."""
    servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+ ", block, re.M)
    if len(servers) != len(upstreams):
        raise AssertionError(f"the documented block has {len(servers)} upstream servers, the test has {len(upstreams)}")
    it = iter(upstreams)
    out = re.sub(r"^(\s*server )127\.0\.0\.1:\d+ ", lambda m: f"{m.group(1)}{next(it)} ", block, flags=re.M)
    out, n = re.subn(r"^(\s*)listen [^;]+;", rf"\g<1>listen 127.0.0.1:{listen_port};", out, flags=re.M)
    if n != 1:
        raise AssertionError(f"the documented block has {n} listen directives; expected 1")
    return out


@dataclass
class Nginx:
    port: int
    proc: subprocess.Popen[bytes]
    root: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.root / "access.log"

    def error_log(self) -> str:
        p = self.root / "error.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def access_records(self) -> list[dict[str, str]]:
        """One dict per logged request (fields of the ``calctl_test`` log format)."""
        rows = []
        for line in self.access_log.read_text().splitlines() if self.access_log.exists() else []:
            rows.append(json.loads(line))
        return rows


# JSON lines: the test joins them with its own records by the X-Request-Id calctl sends.
_LOG_FORMAT = (
    'log_format calctl_test escape=json \'{"msec":"$msec","request_time":"$request_time",'
    '"status":"$status","uri":"$request_uri","upstream_addr":"$upstream_addr",'
    '"upstream_status":"$upstream_status","request_id":"$upstream_http_x_request_id"}\';'
)


@contextlib.contextmanager
def nginx_front(backends: list[Backend], nginx: str) -> Iterator[Nginx]:
    """nginx with the documented block in front of ``backends``, as a non-daemon child; stopped on exit."""
    # Own directory with 0755 so nginx's unprivileged workers can use their temp paths under it.
    root = Path(tempfile.mkdtemp(prefix="calctl-nginx-"))
    os.chmod(root, 0o755)
    proc: subprocess.Popen[bytes] | None = None
    try:
        port = free_port()
        (root / "calctl.conf").write_text(render_nginx(documented_nginx_block(), port, [b.address for b in backends]))
        (root / "nginx.conf").write_text(f"""\
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 512; }}
http {{
    {_LOG_FORMAT}
    access_log {root}/access.log calctl_test;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/calctl.conf;
}}
""")
        base = [nginx, "-p", str(root), "-c", str(root / "nginx.conf"), "-e", str(root / "error.log")]
        check = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise AssertionError(f"nginx -t rejected the documented configuration:\n{check.stderr}")
        with open(root / "nginx.stdout", "wb") as out:
            proc = subprocess.Popen(
                base, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"nginx exited with {proc.returncode}:\n{(root / 'error.log').read_text(errors='replace')}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
            return False

        wait_until(listening, what="nginx to listen", timeout=20, interval=0.05)
        yield Nginx(port, proc, root)
    finally:
        if proc is not None:
            stop_process(proc, signal.SIGQUIT, timeout=10)  # graceful: finish what is in flight, then exit
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------- load


@dataclass
class Outcome:
    """One client request, as the client saw it. ``complete``: a 200 with a whole, well-formed result."""

    index: int
    model: str
    stream: bool
    max_tokens: int
    started: float  # time.time(), comparable with nginx's $msec
    ended: float
    status: int | None
    request_id: str | None
    retry_after: str | None
    complete: bool
    completion_tokens: int
    detail: str
    public_text: str  # headers + body the client received, for leak checks


def _check_stream(text: str, max_tokens: int) -> tuple[bool, int, str]:
    events = [block for block in text.split("\n\n") if block.strip()]
    if not events or events[-1].strip() != "data: [DONE]":
        return False, 0, f"stream did not end with [DONE]: {text[-200:]!r}"
    if any(block.startswith("event: error") for block in events):
        return False, 0, f"stream carried an error event: {text[-300:]!r}"
    finish, tokens = None, -1
    for block in events[:-1]:
        doc = json.loads(block.removeprefix("data: "))
        for choice in doc.get("choices", []):
            finish = choice.get("finish_reason") or finish
        if doc.get("usage"):
            tokens = int(doc["usage"]["completion_tokens"])
    return _check_finish(finish, tokens, max_tokens)


def _check_json(text: str, max_tokens: int) -> tuple[bool, int, str]:
    doc = json.loads(text)
    return _check_finish(doc["choices"][0]["finish_reason"], int(doc["usage"]["completion_tokens"]), max_tokens)


def _check_finish(finish: str | None, tokens: int, max_tokens: int) -> tuple[bool, int, str]:
    if finish == "length" and tokens == max_tokens:
        return True, tokens, ""
    if finish == "stop" and 1 <= tokens <= max_tokens:  # the tiny model may sample EOS early
        return True, tokens, ""
    return False, tokens, f"finish_reason {finish!r} with {tokens} of {max_tokens} tokens"


def one_request(client: httpx.Client, base: str, index: int, model: str, stream: bool, max_tokens: int) -> Outcome:
    body = {
        "model": model,
        "prompt": f"request {index}: the quick brown fox",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    started = time.time()
    status = request_id = retry_after = None
    text, complete, tokens, detail, head = "", False, 0, "", ""
    try:
        with client.stream("POST", f"{base}/v1/completions", json=body) as resp:
            status = resp.status_code
            request_id = resp.headers.get("x-request-id")
            retry_after = resp.headers.get("retry-after")
            head = "\n".join(f"{k}: {v}" for k, v in resp.headers.items())
            text = "".join(resp.iter_text())
        if status == 200:
            complete, tokens, detail = (_check_stream if stream else _check_json)(text, max_tokens)
        else:
            detail = f"HTTP {status}: {text[:300]}"
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        detail = f"{type(exc).__name__}: {exc} (after {len(text)} bytes)"
    return Outcome(
        index,
        model,
        stream,
        max_tokens,
        started,
        time.time(),
        status,
        request_id,
        retry_after,
        complete,
        tokens,
        detail,
        head + "\n\n" + text,
    )


@dataclass
class LoadClient:
    """``workers`` threads sending completions to ``base`` until :meth:`stop`, ``max_requests`` or ``max_seconds``.

    Request i: model ``MODELS[i % 2]``, streaming when ``i % 4 >= 2`` (so both kinds hit both models).
    """

    base: str
    workers: int
    max_tokens: int
    max_requests: int
    max_seconds: float
    results: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._deadline = 0.0

    def _take(self) -> int | None:
        with self._lock:
            if self._stop.is_set() or self._next >= self.max_requests or time.monotonic() > self._deadline:
                return None
            self._next += 1
            return self._next - 1

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0)) as client:
            while (i := self._take()) is not None:
                out = one_request(client, self.base, i, MODELS[i % 2], i % 4 >= 2, self.max_tokens)
                with self._lock:
                    self.results.append(out)

    def start(self) -> LoadClient:
        self._deadline = time.monotonic() + self.max_seconds
        self._threads = [threading.Thread(target=self._run, name=f"load-{n}", daemon=True) for n in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 90.0) -> list[Outcome]:
        """Let every worker finish the request it is in, then return all outcomes (sorted by index)."""
        self._stop.set()
        return self.join(timeout)

    def join(self, timeout: float) -> list[Outcome]:
        """Wait for the workers to run out of requests or time, then return all outcomes (sorted by index)."""
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        with self._lock:
            return sorted(self.results, key=lambda o: o.index)

    def completed(self) -> int:
        with self._lock:
            return sum(1 for o in self.results if o.complete)
