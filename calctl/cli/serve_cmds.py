"""``calctl serve``: the OpenAI-compatible serving core on one board (001 §4, §10).

One process owns one board (000 §3; 001 §5 path C): the board comes from the
environment (``calctl.runtime.selection``) and shows in the internal
``calctl_board_info`` metric, never on public endpoints. SIGTERM or SIGINT
drains before the socket closes (``calctl.serving.api.server``), then the board
is released; the exit code is 0 when every accepted request finished, 4 when
the drain deadline cut some. docs/deploy.md puts N of these behind nginx.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from calctl.cli import _output
from calctl.cli._options import AllowUnsignedOpt, CalrtLibOpt, DeviceKind, DeviceOpt, TrustedKeyOpt
from calctl.cli._package_arg import PackageArg, resolve_package
from calctl.errors import StepTimeout, UsageError


def _parse_keys(pairs: list[str] | None) -> dict[str, str]:
    keys: dict[str, str] = {}
    for item in pairs or []:
        key, sep, tenant = item.partition(":")
        if not sep or not key or not tenant:
            raise UsageError(f"--api-key {item!r}: expected KEY:TENANT")
        keys[key] = tenant
    return keys


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the package loads (nothing listens yet), SIGTERM unwinds like Ctrl-C, so the board is still released."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(
    pkg: PackageArg = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="calculet-dual-model/v1 YAML (001 §10.4), cross-checked with the manifest."),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Bind address. Without API keys only loopback is allowed.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="TCP port to listen on (0: any free port).")
    ] = 8000,
    device: DeviceOpt = DeviceKind.mock,
    calrt_lib: CalrtLibOpt = None,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    api_key: Annotated[
        list[str] | None,
        typer.Option("--api-key", help="KEY:TENANT, repeatable (also CALCTL_API_KEYS=k1:t1,k2:t2)."),
    ] = None,
    admin_key: Annotated[
        list[str] | None,
        typer.Option("--admin-key", envvar="CALCTL_ADMIN_KEY", help="Key for /internal endpoints; repeatable."),
    ] = None,
    fault_plan: Annotated[
        Path | None, typer.Option("--fault-plan", help="Mock only: calctl-fault-plan/v1 YAML.")
    ] = None,
    time_scale: Annotated[
        float, typer.Option("--time-scale", min=0.0, help="Mock only: multiply modelled job times.")
    ] = 1.0,
    serialize_chips: Annotated[
        bool, typer.Option("--serialize-chips", help="Mock only: model a global runtime lock (S1).")
    ] = False,
    warmup_iterations: Annotated[
        int, typer.Option("--warmup-iterations", min=0, help="Warm-up iterations per model before it is Ready.")
    ] = 3,
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout", min=0.0, help="Seconds to drain in-flight requests at shutdown (SIGTERM/SIGINT)."
        ),
    ] = 30.0,
    drain_grace: Annotated[
        float,
        typer.Option(
            "--drain-grace",
            min=0.0,
            help="Keep the socket open at least this long after SIGTERM, answering readiness 503, "
            "so a balancer polling /health/ready notices first.",
        ),
    ] = 0.0,
    log_level: Annotated[
        str, typer.Option("--log-level", help="Server log level: debug, info, warning, error or critical.")
    ] = "info",
) -> None:
    """Serve the package's models over an OpenAI-compatible HTTP API (one model per chip).

    One process per board: the board comes from CALCTL_BOARD_ID / CALCTL_MOCK_SEED (mock) or
    CALRT_DEVICE (CalRT). SIGTERM or SIGINT stops admission (readiness 503), drains accepted
    requests within --drain-timeout, then exits 0 (4 if the deadline cut requests).
    """
    import os

    import uvicorn

    from calctl.runtime import open_runtime, select_board
    from calctl.serving.api.app import ApiSettings, create_app
    from calctl.serving.api.server import DrainingServer
    from calctl.serving.config import load_dual_model_config
    from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions

    keys = _parse_keys(api_key)
    env_keys = os.environ.get("CALCTL_API_KEYS")
    if env_keys:
        keys.update(_parse_keys([k for k in env_keys.split(",") if k.strip()]))
    if not keys and not _is_loopback(host):
        raise UsageError(
            f"--host {host}: refusing to serve without API keys on a non-loopback address",
            hint="add --api-key KEY:TENANT (and --admin-key), or bind to 127.0.0.1",
        )
    if device is not DeviceKind.mock and (fault_plan or serialize_chips or time_scale != 1.0):
        raise UsageError("--fault-plan, --time-scale and --serialize-chips apply to the mock device only")
    board = select_board(device.value)
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    path, policy, _ = resolve_package(pkg, trusted_key, allow_unsigned)
    dual = load_dual_model_config(config) if config else None
    mock_opts = {"time_scale": time_scale, "serialize_chips": serialize_chips, **board.mock_options()}
    if fault_plan:
        mock_opts["fault_plan"] = fault_plan
    rt = open_runtime(device.value, calrt_lib, **(mock_opts if device is DeviceKind.mock else {}))
    server: DrainingServer | None = None
    with rt:
        sup = DeviceSupervisor(
            rt,
            trust=policy,
            dual_config=dual,
            options=SupervisorOptions(warmup_iterations=warmup_iterations, drain_deadline_s=drain_timeout),
        )
        sup.metrics.board_info.labels(board.board, rt.kind.value).set(1)
        try:
            with _sigterm_interrupts():
                sup.start(path)  # verify, validate, budget, configure, golden + warm-up (001 §11.1)
            engine = ServingEngine(sup)
            app = create_app(engine, ApiSettings(api_keys=keys, admin_keys=frozenset(admin_key or [])))
            aliases = ", ".join(sup.workers)
            _output.info(
                f"serving {aliases} from {path} on http://{host}:{port}, board {board.board} ({rt.kind.value} device"
                + (": mock results are not hardware evidence)" if rt.kind.value == "mock" else ")")
            )
            server = DrainingServer(
                uvicorn.Config(
                    app,
                    host=host,
                    port=port,
                    log_level=log_level.lower(),
                    timeout_graceful_shutdown=max(1, int(drain_timeout)),
                ),
                engine,
                drain_timeout_s=drain_timeout,
                drain_grace_s=drain_grace,
            )
            server.run()
            engine.start_draining()
        finally:
            # What the signal-driven drain left of the budget; the supervisor drains the rest and releases the board.
            sup.shutdown(server.remaining_s() if server is not None else drain_timeout)
    assert server is not None  # sup.start() and create_app() raise rather than leave it unset
    outcome = server.outcome()
    if outcome.signal is not None:
        if not outcome.drained:
            how = "a second signal" if outcome.forced else f"the drain deadline (--drain-timeout {drain_timeout:g} s)"
            raise StepTimeout(
                f"{outcome.signal}: {how} closed the server with accepted requests still running",
                hint="raise --drain-timeout above the longest generation you allow",
            )
        _output.info(f"{outcome.signal}: drained in {outcome.seconds:.2f} s, board {board.board} released")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
