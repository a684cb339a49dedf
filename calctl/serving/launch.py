"""The wiring of ``calctl serve``: socket, board, supervisor, engine, app, draining uvicorn (001 §4, §10, §11.1).

Order matters, and is the point of this module:

1. the listening socket is bound first, so a port that is taken is a usage error
   (exit 2) before the board is opened or the package is loaded;
2. the board is opened (one process per board, 000 §3), the package is verified,
   validated, planned, configured and passed through golden + warm-up
   (:meth:`DeviceSupervisor.start`); SIGTERM meanwhile unwinds like Ctrl-C, so the
   board is still released;
3. uvicorn serves the app on the bound socket; SIGTERM/SIGINT drains before the
   socket closes (:mod:`calctl.serving.api.server`);
4. the supervisor drains what is left and releases the board.

The CLI (``calctl/cli/serve_cmds.py``) parses options, calls :func:`run` and renders
what it returns; it picks no port, opens no board and builds no app.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import ipaddress
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from calctl.errors import Interrupted, StepTimeout, UsageError, note_signal, raise_dropped_signal
from calctl.serving.record_sink import DEFAULT_MAX_BYTES, RecordSink
from calctl.signing.policy import TrustPolicy


@dataclass(frozen=True)
class ServeOptions:
    package: Path
    trust: TrustPolicy
    config: Path | None = None  # calculet-dual-model/v1 YAML
    scheduler_configs: tuple[Path, ...] = ()  # calculet-scheduler/v1 YAML, one per alias (--scheduler-config)
    pin_digest: str | None = None  # --pin-digest: serve (and load) only the package with this digest
    package_roots: tuple[Path, ...] = ()  # --package-root: where an admin load may name a package
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "mock"
    calrt_lib: Path | None = None
    mock: dict[str, Any] = field(default_factory=dict)  # time_scale, serialize_chips, fault_plan
    api_keys: dict[str, str] = field(default_factory=dict)
    admin_keys: frozenset[str] = frozenset()
    metrics_public: bool = False  # serve /metrics without the admin check (docs/serve.md "Metrics access")
    max_body_bytes: int | None = None  # --max-body-mb; None: the config's api.max_body_mb, else the default
    records: str | None = None  # 001 §14 NDJSON records: a directory, "-" for stderr, None for none
    records_max_bytes: int = DEFAULT_MAX_BYTES
    warmup_iterations: int = 3
    audit_interval_s: float = 60.0  # the serving audit's known-answer probe per alias (0: off; docs/serve.md)
    drain_timeout_s: float = 30.0
    drain_grace_s: float = 0.0
    log_level: str = "info"


@dataclass(frozen=True)
class ServeResult:
    board: str
    signal: str | None
    drained: bool
    seconds: float


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` now, or raise UsageError (exit 2) naming the port and what to do."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: cannot resolve the address ({exc.strerror})") from None
    family, type_, proto, _, addr = infos[0]
    # proto must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says
    # TCP, and without it Nagle + delayed ACK hold a stream's small SSE writes for 40 ms on a kept-alive
    # connection (what uvicorn's own bind gets right by using getaddrinfo's proto).
    sock = socket.socket(family, type_, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "taken"
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"--port {port}: {host}:{port} is already in use by another process",
                hint=f"choose another --port, or stop what listens there (`ss -ltnp 'sport = :{port}'`)",
            ) from None
        if exc.errno == errno.EACCES:
            raise UsageError(
                f"--port {port}: not allowed to listen on {host}:{port}", hint="ports below 1024 need privileges"
            ) from None
        raise UsageError(f"--host {host} --port {port}: cannot listen there: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the package loads (nothing served yet), SIGTERM unwinds like Ctrl-C, so the board is still released."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    fired: list[str] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if fired:
            return  # already unwinding: let the board's release finish
        fired.append("SIGTERM")
        note_signal("SIGTERM")  # kept: a raise that lands in a GC callback is dropped (errors.signal_unraised)
        raise Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
        raise_dropped_signal()  # its raise was dropped and the load went on to the end: unwind it now
    finally:
        signal.signal(signal.SIGTERM, previous)
        if fired:
            note_signal(None)  # said by the Interrupted unwinding now; a later load in this process starts clean


def preflight(host: str, port: int, *, api_keys: dict[str, str], device: str, mock: dict[str, Any]) -> socket.socket:
    """The checks that need neither the board nor the package, then the bound listener (see the module docstring)."""
    if not api_keys and not is_loopback(host):
        raise UsageError(
            f"--host {host}: refusing to serve without API keys on a non-loopback address",
            hint="add --api-key KEY:TENANT (and --admin-key), or bind to 127.0.0.1",
        )
    if device != "mock" and mock:
        raise UsageError("--fault-plan, --time-scale and --serialize-chips apply to the mock device only")
    return bind_listener(host, port)


def load_scheduler_files(paths: tuple[Path, ...]) -> dict[str, Any]:
    """``--scheduler-config`` files by the alias each names (``model_alias``); two for one alias is a usage error."""
    from calctl.serving.config import load_scheduler_config

    out: dict[str, Any] = {}
    where: dict[str, Path] = {}
    for path in paths:
        cfg = load_scheduler_config(path)
        if cfg.model_alias in out:
            raise UsageError(
                f"--scheduler-config {path}: model_alias {cfg.model_alias!r} is already configured by "
                f"{where[cfg.model_alias]}"
            )
        out[cfg.model_alias] = cfg
        where[cfg.model_alias] = path
    return out


def checked_package_roots(roots: tuple[Path, ...]) -> list[Path]:
    """``--package-root`` directories, resolved; one that is not a readable directory is a usage error."""
    out = []
    for root in roots:
        resolved = Path(root).expanduser().resolve()
        if not resolved.is_dir():
            raise UsageError(f"--package-root {root}: not a directory")
        out.append(resolved)
    return out


def run(opts: ServeOptions, *, info: Callable[[str], None], listener: socket.socket | None = None) -> ServeResult:
    """Serve until SIGTERM/SIGINT; return how it stopped. Raises CalctlError subclasses for the CLI to map.

    ``listener``: the socket :func:`preflight` returned (the CLI calls it before it resolves the package);
    without one, preflight runs here, still before the board is opened."""
    sock = listener
    if sock is None:
        sock = preflight(opts.host, opts.port, api_keys=opts.api_keys, device=opts.device, mock=opts.mock)
    try:
        return _serve(opts, sock, info)
    finally:
        sock.close()


def _record_sink(opts: ServeOptions) -> RecordSink:
    if opts.records is None:
        return RecordSink()
    if opts.records == "-":
        return RecordSink.to_stream(sys.stderr)
    if not opts.records.strip():  # Path("") is the working directory: never a silent default
        raise UsageError("--records '': expected a directory for records.ndjson, or `-` for stderr")
    return RecordSink.to_directory(Path(opts.records), max_bytes=opts.records_max_bytes)


def freeze_startup_heap() -> None:
    """Collect once, then move every object start-up left into the collector's permanent generation (``gc.freeze``).

    Start-up (imports, the package's manifest and graphs, the loaded model's wrappers, the app) leaves a few
    hundred thousand objects that live as long as the process. Unfrozen, every generation-2 collection walks them
    all, on whichever thread happened to allocate: the engine's between two steps, the event loop's in a
    request. Frozen, a collection walks only what serving allocated since (issue #55 item 1;
    ``benchmarks/bench_gc.py`` measures the pauses with and without).
    """
    gc.collect()
    gc.freeze()


def _serve(opts: ServeOptions, sock: socket.socket, info: Callable[[str], None]) -> ServeResult:
    import uvicorn

    from calctl.runtime import open_runtime, select_board
    from calctl.serving.api.app import create_app
    from calctl.serving.api.auth import ApiSettings
    from calctl.serving.api.guard import DEFAULT_MAX_BODY_BYTES
    from calctl.serving.api.server import DrainingServer
    from calctl.serving.config import load_dual_model_config, normalize_digest
    from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
    from calctl.serving.engine.audit import BoardAudit
    from calctl.serving.engine.metrics import EngineMetrics
    from calctl.serving.engine.options import LoadPolicy

    board = select_board(opts.device)
    logging.basicConfig(
        level=opts.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    dual = load_dual_model_config(opts.config) if opts.config else None
    scheduler_configs = load_scheduler_files(opts.scheduler_configs)
    load_policy = LoadPolicy(
        pinned_digest=normalize_digest(opts.pin_digest),
        package_roots=tuple(checked_package_roots(opts.package_roots)),
        fail_unclean_unload=True,  # 000 §12: a device an unload left dirty takes no new load
    )
    mock_opts = {"time_scale": 1.0, "serialize_chips": False, **opts.mock, **board.mock_options()}
    records = _record_sink(opts)  # a bad --records is a usage error before the board is opened
    rt = open_runtime(opts.device, opts.calrt_lib, **(mock_opts if opts.device == "mock" else {}))
    port = sock.getsockname()[1]
    server: DrainingServer | None = None
    audit: BoardAudit | None = None
    with rt, contextlib.closing(records):
        sup = DeviceSupervisor(
            rt,
            trust=opts.trust,
            dual_config=dual,
            scheduler_configs=scheduler_configs,
            options=SupervisorOptions(warmup_iterations=opts.warmup_iterations, drain_deadline_s=opts.drain_timeout_s),
            load_policy=load_policy,
            metrics=EngineMetrics(records),
        )
        versions = rt.versions()
        # The device label says what the board is: mock, calrt, or calrt-software-model (the reference board).
        device_label = rt.kind.value + (
            "-software-model" if versions.software_model and rt.kind.value != "mock" else ""
        )
        sup.metrics.board_info.labels(board.board, device_label).set(1)
        try:
            with _sigterm_interrupts():
                sup.start(opts.package)  # verify, validate, budget, configure, golden + warm-up (001 §11.1)
            engine = ServingEngine(sup)
            app = create_app(
                engine,
                ApiSettings(
                    api_keys=opts.api_keys,
                    admin_keys=opts.admin_keys,
                    metrics_public=opts.metrics_public,
                    max_body_bytes=opts.max_body_bytes or (dual and dual.max_body_bytes) or DEFAULT_MAX_BODY_BYTES,
                ),
            )
            freeze_startup_heap()
            info(
                f"serving {', '.join(sup.cores)} from {opts.package} on http://{opts.host}:{port}, board "
                f"{board.board} ({rt.kind.value} device"
                + (
                    ": mock results are not hardware evidence)"
                    if rt.kind.value == "mock"
                    else f": {versions.firmware}, a software model; its results are not hardware evidence)"
                    if versions.software_model
                    else ")"
                )
            )
            server = DrainingServer(
                uvicorn.Config(
                    app,
                    host=opts.host,
                    port=port,
                    log_level=opts.log_level.lower(),
                    timeout_graceful_shutdown=max(1, int(opts.drain_timeout_s)),
                ),
                engine,
                drain_timeout_s=opts.drain_timeout_s,
                drain_grace_s=opts.drain_grace_s,
            )
            if opts.audit_interval_s > 0:  # issue 50: a board that goes wrong while serving leaves service
                audit = BoardAudit(engine, opts.audit_interval_s)
                audit.start()
            server.run(sockets=[sock])
            engine.start_draining()
        finally:
            if audit is not None:
                audit.stop()
            # What the signal-driven drain left of the budget; the supervisor drains the rest and releases the board.
            sup.shutdown(server.remaining_s() if server is not None else opts.drain_timeout_s)
    assert server is not None  # sup.start() and create_app() raise rather than leave it unset
    outcome = server.outcome()
    if outcome.signal is not None and not outcome.drained:
        how = (
            "a second signal" if outcome.forced else f"the drain deadline (--drain-timeout {opts.drain_timeout_s:g} s)"
        )
        raise StepTimeout(
            f"{outcome.signal}: {how} closed the server with accepted requests still running",
            hint="raise --drain-timeout above the longest generation you allow",
        )
    return ServeResult(board.board, outcome.signal, outcome.drained, outcome.seconds)


__all__ = ["ServeOptions", "ServeResult", "bind_listener", "is_loopback", "preflight", "run"]
