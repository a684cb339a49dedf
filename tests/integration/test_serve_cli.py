"""``calctl serve`` start-up as a user meets it (issue 21): a port that is taken is calctl's own usage error,
exit 2, before the board is opened or the package is loaded."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback


@pytest.fixture
def taken_port() -> Iterator[int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_a_taken_port_is_exit_2_before_the_board_or_the_package(
    cli: Cli, taken_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A board that cannot be opened and a bundled sample that would have to be built: either would show if
    # serve touched it before the port (exit 3 for the board, files in the cache for the sample).
    cache = tmp_path / "cache"
    monkeypatch.setenv("CALCTL_CACHE_DIR", str(cache))
    monkeypatch.setenv("CALRT_LIBRARY", str(tmp_path / "no-such-libcalrt.so"))
    r = cli("serve", "--device", "calrt", "--port", str(taken_port))
    assert_no_traceback(r)
    assert r.code == 2, r.err
    assert f"error: --port {taken_port}: 127.0.0.1:{taken_port} is already in use" in r.err
    assert "hint: choose another --port" in r.err
    assert "Errno" not in r.err and "serving" not in r.err
    assert not cache.exists() or not any(cache.iterdir())  # the bundled sample was never built


def test_a_taken_port_with_a_package_never_loads_it(cli: Cli, taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import calctl.serving.engine.supervisor as supervisor

    def forbidden(*_a: object, **_kw: object) -> None:
        raise AssertionError("the package was loaded before the port was checked")

    monkeypatch.setattr(supervisor.DeviceSupervisor, "start", forbidden)
    r = cli("serve", FIXTURE_PACKAGES / "single", "--trusted-key", TEST_PUB, "--port", str(taken_port))
    assert r.code == 2 and "already in use" in r.err, r.err


def test_the_listener_lets_asyncio_disable_nagle() -> None:
    """Found by benchmarks/bench_serve.py: a listener created with proto 0 gives accepted connections without
    TCP_NODELAY (asyncio checks proto), and SSE deltas on a kept-alive connection then wait 40 ms for a delayed
    ACK. The listener says IPPROTO_TCP, so every connection uvicorn accepts from it has TCP_NODELAY."""
    import asyncio

    from calctl.serving.launch import bind_listener

    listener = bind_listener("127.0.0.1", 0)
    assert listener.proto == socket.IPPROTO_TCP

    async def accept_one() -> int:
        seen: list[int] = []
        accepted = asyncio.Event()

        def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            accepted.set()

        server = await asyncio.start_server(on_conn, sock=listener)
        port = listener.getsockname()[1]
        _, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            await asyncio.wait_for(accepted.wait(), timeout=2)
        except asyncio.TimeoutError:
            raise AssertionError("the listener accepted no connection within 2 s") from None
        w.close()
        server.close()
        return seen[0]

    assert asyncio.run(accept_one()) != 0


def test_a_fifo_given_as_the_package_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Hostile test of issue 19: ``calctl serve FIFO`` blocked for ever in tarfile.open (a subprocess, so a
    hang fails the test at its deadline instead of hanging the suite)."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "pkg.tar"
    os.mkfifo(fifo)
    env = {**os.environ, "CALCTL_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "calctl", "serve", str(fifo), "--trusted-key", str(TEST_PUB), "--port", "0"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("calctl serve waited on the FIFO")
    assert r.returncode in (1, 2), r.stderr
    assert "is a FIFO, not a regular file" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309", "0", "-1", "1e-9"])
def test_records_max_mb_that_is_not_a_positive_size_is_a_usage_error(
    cli: Cli, tmp_path: Path, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile test of issue 19: nan and inf crashed with "internal error (a calctl bug)"."""
    _never_open_the_board(monkeypatch)
    r = cli(
        "serve", FIXTURE_PACKAGES / "single", "--trusted-key", TEST_PUB, "--port", "0",
        "--records", tmp_path / "rec", "--records-max-mb", value,
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 2, r.err
    assert "--records-max-mb" in r.err and "internal error" not in r.err, r.err


def test_an_empty_records_directory_is_a_usage_error_not_the_working_directory(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--records ''`` wrote records.ndjson into the server's working directory."""
    _never_open_the_board(monkeypatch)
    monkeypatch.chdir(tmp_path)
    r = cli("serve", FIXTURE_PACKAGES / "single", "--trusted-key", TEST_PUB, "--port", "0", "--records", "")
    assert r.code == 2 and "--records" in r.err and "expected a directory" in r.err, r.err
    assert not (tmp_path / "records.ndjson").exists()


def _never_open_the_board(monkeypatch: pytest.MonkeyPatch) -> None:
    """These refusals come before the board opens; a miss fails at once instead of serving until killed."""
    import calctl.runtime

    def forbidden(*_a: object, **_kw: object) -> None:
        raise AssertionError("the board was opened: the option was not refused first")

    monkeypatch.setattr(calctl.runtime, "open_runtime", forbidden)
