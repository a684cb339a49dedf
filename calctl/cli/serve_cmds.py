"""``calctl serve``: the OpenAI-compatible serving core on one board (001 §4, §10).

One process owns one board (000 §3; 001 §5 path C): the board comes from the
environment (``calctl.runtime.selection``) and shows in the internal
``calctl_board_info`` metric, never on public endpoints. SIGTERM or SIGINT
drains before the socket closes (``calctl.serving.api.server``), then the board
is released; the exit code is 0 when every accepted request finished, 4 when
the drain deadline cut some. docs/deploy.md puts N of these behind nginx.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calctl.cli import _output
from calctl.cli._device import DEVICE_DEFAULTS, DeviceArgs, device_options
from calctl.cli._options import float_option, int_option
from calctl.cli._package_arg import PackageArg
from calctl.errors import UsageError


def _parse_keys(pairs: list[str] | None) -> dict[str, str]:
    keys: dict[str, str] = {}
    for item in pairs or []:
        key, sep, tenant = item.partition(":")
        if not sep or not key or not tenant:
            raise UsageError(f"--api-key {item!r}: expected KEY:TENANT")
        keys[key] = tenant
    return keys


# serve's options, in the order --help lists them: the package, the network and keys, limits and records,
# the mock, the lifecycle.
_ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="calculet-dual-model/v1 YAML (001 §10.4), cross-checked with the manifest."),
]

_SchedulerConfigOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--scheduler-config",
        help="calculet-scheduler/v1 YAML (000 §15) for the alias its model_alias names; repeatable, one per "
        "alias. Overrides that alias's scheduler block of --config.",
    ),
]

_PinDigestOpt = Annotated[
    str | None,
    typer.Option(
        "--pin-digest",
        help="Serve only the package with this digest (64 hex digits, as `calctl inspect` prints it); "
        "start-up, load and reload of any other package fail.",
    ),
]

_PackageRootOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--package-root",
        help='Directory an admin load (a POST of {"package": PATH} to a model\'s load endpoint under '
        "/internal/models) may name a package under; repeatable. The start-up package is always allowed.",
    ),
]

_HostOpt = Annotated[str, typer.Option("--host", help="Bind address. Without API keys only loopback is allowed.")]

_PortOpt = Annotated[
    int,
    int_option(
        "--port", min=0, max=65535, help="TCP port to listen on (0: any free port); checked before the board opens."
    ),
]

_ApiKeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--api-key",
        help="KEY:TENANT, repeatable (also the CALCTL_API_KEYS variable, comma-separated: k1:t1,k2:t2).",
    ),
]

_AdminKeyOpt = Annotated[
    list[str] | None,
    typer.Option("--admin-key", envvar="CALCTL_ADMIN_KEY", help="Key for /internal endpoints; repeatable."),
]

_MetricsPublicOpt = Annotated[
    bool,
    typer.Option(
        "--metrics-public",
        help="Serve /metrics without the admin key (default: behind it, like /internal; docs/serve.md).",
    ),
]

_MaxBodyMbOpt = Annotated[
    float | None,
    float_option(
        "--max-body-mb",
        min=0.001,
        max=256,
        help="The largest request body read, in MiB (default: api.max_body_mb of --config, else 4); "
        "a larger one is refused with 413 while it arrives.",
    ),
]

_RecordsOpt = Annotated[
    str | None,
    typer.Option(
        "--records",
        help="Write 001 §14 per-request and per-job NDJSON records to DIR/records.ndjson (rotating), "
        "or `-` for stderr (docs/serve.md).",
    ),
]

_RecordsMaxMbOpt = Annotated[
    float, float_option("--records-max-mb", help="Rotate DIR/records.ndjson at this size (5 kept).")
]

_TimeScaleOpt = Annotated[float, float_option("--time-scale", min=0.0, help="Mock only: multiply modelled job times.")]

_SerializeChipsOpt = Annotated[
    bool, typer.Option("--serialize-chips", help="Mock only: model a global runtime lock (S1).")
]

_WarmupIterationsOpt = Annotated[
    int, int_option("--warmup-iterations", min=0, help="Warm-up iterations per model before it is Ready.")
]

_AuditIntervalOpt = Annotated[
    float,
    float_option(
        "--audit-interval",
        min=0.0,
        help="Seconds between the serving audit's known-answer probes of each alias (also right after every "
        "recovery); a wrong answer takes the alias out of service (docs/serve.md). 0 turns it off.",
    ),
]

_DrainTimeoutOpt = Annotated[
    float,
    float_option("--drain-timeout", min=0.0, help="Seconds to drain in-flight requests at shutdown (SIGTERM/SIGINT)."),
]

_DrainGraceOpt = Annotated[
    float,
    float_option(
        "--drain-grace",
        min=0.0,
        help="Keep the socket open at least this long after SIGTERM, answering readiness 503, "
        "so a balancer polling /health/ready notices first.",
    ),
]

_LogLevelOpt = Annotated[
    str, typer.Option("--log-level", help="Server log level: debug, info, warning, error or critical.")
]


@device_options("fault_plan")
def serve(
    pkg: PackageArg = None,
    config: _ConfigOpt = None,
    scheduler_config: _SchedulerConfigOpt = None,
    pin_digest: _PinDigestOpt = None,
    package_root: _PackageRootOpt = None,
    host: _HostOpt = "127.0.0.1",
    port: _PortOpt = 8000,
    dev: DeviceArgs = DEVICE_DEFAULTS,
    api_key: _ApiKeyOpt = None,
    admin_key: _AdminKeyOpt = None,
    metrics_public: _MetricsPublicOpt = False,
    max_body_mb: _MaxBodyMbOpt = None,
    records: _RecordsOpt = None,
    records_max_mb: _RecordsMaxMbOpt = 64.0,
    time_scale: _TimeScaleOpt = 1.0,
    serialize_chips: _SerializeChipsOpt = False,
    warmup_iterations: _WarmupIterationsOpt = 3,
    audit_interval: _AuditIntervalOpt = 60.0,
    drain_timeout: _DrainTimeoutOpt = 30.0,
    drain_grace: _DrainGraceOpt = 0.0,
    log_level: _LogLevelOpt = "info",
) -> None:
    """Serve the package's models over an OpenAI-compatible HTTP API (one model per chip).

    One process per board: the board comes from CALCTL_BOARD_ID / CALCTL_MOCK_SEED (mock) or
    CALRT_DEVICE (CalRT). SIGTERM or SIGINT stops admission (readiness 503), drains accepted
    requests within --drain-timeout, then exits 0 (4 if the deadline cut requests).
    """
    import math
    import os

    from calctl.serving import launch as serving_launch
    from calctl.serving.config import mib_bytes

    if not math.isfinite(records_max_mb) or int(records_max_mb * 2**20) <= 0:
        raise UsageError(f"--records-max-mb {records_max_mb:g}: expected a positive, finite size in MiB")
    keys = _parse_keys(api_key)
    env_keys = os.environ.get("CALCTL_API_KEYS")
    if env_keys:
        keys.update(_parse_keys([k for k in env_keys.split(",") if k.strip()]))
    mock: dict[str, object] = {}
    if time_scale != 1.0:
        mock["time_scale"] = time_scale
    if serialize_chips:
        mock["serialize_chips"] = True
    if dev.fault_plan:
        mock["fault_plan"] = dev.fault_plan
    # The port first: a port in use is a usage error before the board is opened or the package loaded.
    listener = serving_launch.preflight(host, port, api_keys=keys, device=dev.device.value, mock=mock)
    try:
        path, policy, _ = dev.package(pkg)
        opts = serving_launch.ServeOptions(
            package=path,
            trust=policy,
            config=config,
            scheduler_configs=tuple(scheduler_config or ()),
            pin_digest=pin_digest,
            package_roots=tuple(package_root or ()),
            host=host,
            port=port,
            device=dev.device.value,
            calrt_lib=dev.calrt_lib,
            mock=mock,
            api_keys=keys,
            admin_keys=frozenset(admin_key or []),
            metrics_public=metrics_public,
            max_body_bytes=mib_bytes(max_body_mb),
            records=records,
            records_max_bytes=int(records_max_mb * 2**20),
            warmup_iterations=warmup_iterations,
            audit_interval_s=audit_interval,
            drain_timeout_s=drain_timeout,
            drain_grace_s=drain_grace,
            log_level=log_level,
        )
        result = serving_launch.run(opts, info=_output.info, listener=listener)
    finally:
        listener.close()
    if result.signal is not None:
        _output.info(f"{result.signal}: drained in {result.seconds:.2f} s, board {result.board} released")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
