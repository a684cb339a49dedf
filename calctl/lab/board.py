"""One calctl command for one lab board, on the host that has the board (docs/lab.md).

A lab board is what an exporter publishes as a ``CalculetBoard`` resource: its label, the device kind, what
selects it (``CALRT_DEVICE``, or the mock's seed and fault plan), the shim library and the host it hangs off.
:class:`LabBoard` holds that; :func:`run_on_board` runs one calctl command for it, on this machine or through
an SSH command prefix (labgrid's control-master connection), streams the command's progress lines, and brings
its report directory and JUnit back into a local directory.

Every outcome is one of two kinds: the board's own (the command ran and wrote its report: PASS, FAIL, a device
ERROR) or the infrastructure's (the host could not be reached, the connection dropped, the command could not
start or left no report): :attr:`BoardRun.infra_error` says which, and never turns the latter into a board FAIL.

This module needs no labgrid: it takes the command prefix as a list. It does not reserve or lock anything.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

from calctl.errors import UsageError
from calctl.fleet.merge import BOARD_FILE
from calctl.records import write_json
from calctl.runtime.selection import BOARD_ID_ENV, CALRT_DEVICE_ENV, MOCK_SEED_ENV, select_board

#: The file each board's local directory gets beside the command's own report: who ran what where.
RUN_FILE = "lab-run.json"
#: The command's JUnit (stdout of ``--format junit``), for the commands that have it.
JUNIT_FILE = "junit.xml"
#: The command's stderr (its progress lines), as it ran.
LOG_FILE = "calctl.log"

#: How the lab asks each command for its evidence: ``dir`` commands take ``--report DIR``, ``file`` commands
#: ``--report FILE`` (written as ``report.json`` in the run's directory); ``junit`` says ``--format junit`` exists.
COMMANDS: dict[str, tuple[str, bool]] = {
    "bringup": ("dir", True),
    "accept": ("dir", True),
    "soak": ("dir", False),
    "run-golden": ("file", True),
    "warmup": ("file", True),
    "poc combined": ("file", True),
    "device check": ("file", True),
    "device reset": ("file", True),
    "device selftest": ("file", False),
}
#: Options the lab sets itself on every command; a user who passes them is told so.
_LAB_OWNED = ("--report", "--format", "-f", "--device", "--calrt-lib", "--fault-plan")
#: Exit codes that say the command never ran as calctl: ssh's own failure (255), a shell that could not find
#: or execute the program (127, 126).
_TRANSPORT_CODES = {
    255: "the SSH connection failed or dropped",
    127: "calctl was not found",
    126: "calctl is not executable",
}
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,252}")


@dataclass(frozen=True)
class LabBoard:
    """A board as a lab publishes it (the fields of the ``CalculetBoard`` resource; docs/lab.md)."""

    board_id: str
    device: str = "mock"
    calrt_device: str | None = None
    mock_seed: int | None = None
    fault_plan: str | None = None
    calrt_library: str | None = None
    host: str | None = None  # the host to reach over SSH; None: the board is on the machine that runs calctl lab
    calctl: str = "calctl"  # how to start calctl on that host (split like a shell would)
    workdir: str | None = None  # where on that host a run writes before the report comes back (default $TMPDIR)

    def __post_init__(self) -> None:
        where = f"board {self.board_id!r}"
        if self.device not in ("mock", "calrt"):
            raise UsageError(f"{where}: device {self.device!r}: expected mock or calrt")
        select_board(self.device, {BOARD_ID_ENV: self.board_id})  # the label rule of CALCTL_BOARD_ID, exit 2
        if self.mock_seed is not None and (isinstance(self.mock_seed, bool) or self.mock_seed < 0):
            raise UsageError(f"{where}: mock_seed {self.mock_seed!r}: expected a non-negative integer")
        if self.device == "calrt" and (self.mock_seed is not None or self.fault_plan):
            raise UsageError(f"{where}: mock_seed and fault_plan are for the mock device, not calrt")
        if self.host is not None and not _HOST.fullmatch(self.host):
            raise UsageError(f"{where}: host {self.host!r}: expected a host name or user@host")
        if not shlex.split(self.calctl):
            raise UsageError(f"{where}: calctl {self.calctl!r}: expected a command")

    def environment(self) -> dict[str, str]:
        """The board's environment for calctl (docs/deploy.md §1)."""
        env = {BOARD_ID_ENV: self.board_id}
        if self.calrt_device:
            env[CALRT_DEVICE_ENV] = self.calrt_device
        if self.mock_seed is not None:
            env[MOCK_SEED_ENV] = str(self.mock_seed)
        if self.calrt_library:
            env["CALRT_LIBRARY"] = self.calrt_library
        return env

    def identity(self, place: str | None = None) -> dict[str, Any]:
        """The board's ``board.json`` (the fleet report's identity of a row, :mod:`calctl.fleet.merge`)."""
        return {
            "id": self.board_id,
            "kind": self.device,
            "device": self.calrt_device,
            "seed": self.mock_seed,
            "fault_plan": self.fault_plan,
            "library": self.calrt_library,
            "host": self.host or socket.gethostname(),
            "place": place or self.host or socket.gethostname(),
        }

    def describe(self) -> dict[str, Any]:
        return {
            "board_id": self.board_id,
            "device": self.device,
            "calrt_device": self.calrt_device,
            "mock_seed": self.mock_seed,
            "fault_plan": self.fault_plan,
            "calrt_library": self.calrt_library,
            "host": self.host,
        }


def board_from_params(params: dict[str, Any]) -> LabBoard:
    """A :class:`LabBoard` from a resource's parameters (an exporter config's fields); unknown fields refused."""
    known = {f for f in LabBoard.__dataclass_fields__}
    unknown = sorted(set(params) - known)
    if unknown:
        raise UsageError(f"CalculetBoard: unknown field(s) {unknown}: expected {sorted(known)}")
    if "board_id" not in params or not isinstance(params["board_id"], str):
        raise UsageError(f"CalculetBoard: board_id {params.get('board_id')!r}: expected a board label")
    values = {k: v for k, v in params.items() if v not in (None, "")}
    if "mock_seed" in values and not isinstance(values["mock_seed"], int):
        raise UsageError(
            f"CalculetBoard {params['board_id']!r}: mock_seed {values['mock_seed']!r}: expected an integer"
        )
    return LabBoard(**values)


@dataclass(frozen=True)
class LabCommand:
    """A calctl command line as the user gave it (after ``--``), and how the lab collects its evidence."""

    args: tuple[str, ...]
    name: str
    report: str  # "dir" | "file"
    junit: bool

    @classmethod
    def parse(cls, args: Sequence[str]) -> LabCommand:
        args = tuple(args)
        name = " ".join(args[:2]) if " ".join(args[:2]) in COMMANDS else (args[0] if args else "")
        if name not in COMMANDS:
            raise UsageError(
                f"calctl lab: command {' '.join(args[:2]) or '(none)'!r}: expected one of {', '.join(COMMANDS)}",
                hint="put the calctl command after --, e.g. calctl lab run --tags board=calculet -- bringup --level quick",
            )
        owned = [a for a in args if a.split("=", 1)[0] in _LAB_OWNED]
        if owned:
            raise UsageError(
                f"calctl lab: {owned[0].split('=', 1)[0]} is set by the lab for each board (report directory, JUnit, the board's "
                "device, library and fault plan): remove it from the command"
            )
        report, junit = COMMANDS[name]
        return cls(args, name, report, junit)


@dataclass
class BoardRun:
    """What one command on one board gave: the local directory, the exit code and, for the infrastructure's
    failures, why (then there is no board verdict)."""

    board: LabBoard
    out_dir: Path
    command: tuple[str, ...]
    exit_code: int | None = None
    seconds: float = 0.0
    started_at: float = 0.0  # wall clock (epoch seconds): when the command started and ended on the board
    ended_at: float = 0.0
    infra_error: str | None = None
    verdict: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def report_json(self) -> Path:
        return self.out_dir / "report.json"

    def document(self) -> dict[str, Any]:
        return {
            "board": self.board.describe(),
            "command": list(self.command),
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "verdict": self.verdict,
            "infra_error": self.infra_error,
            **self.extra,
        }


class Stopper:
    """Lets another thread stop a running board command (its exporter went away, the run was interrupted):
    SIGTERM, so calctl unwinds and writes what it has (docs/cli.md, Signals).

    Here the command's process group gets it. On a remote host the command itself gets it, through a second
    command over the same prefix (``kill -TERM <pid>``: its pid is the first line it prints); the local SSH
    client is ended only when that did not end the command within :data:`REMOTE_GRACE_S` (the host is gone),
    so a reachable host's command writes its report and the report still comes back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._remote: tuple[list[str], int] | None = None  # (prefix, pid on the host)
        self.reason: str | None = None

    def attach(self, proc: subprocess.Popen[bytes] | None) -> None:
        with self._lock:
            self._proc = proc
            self._remote = None
            if proc is not None and self.reason is not None:
                _terminate(proc)

    def attach_remote(self, prefix: Sequence[str], pid: int) -> None:
        with self._lock:
            self._remote = (list(prefix), pid)
            if self.reason is not None:
                self._stop_remote()

    def stop(self, reason: str) -> None:
        with self._lock:
            first = self.reason is None
            if first:
                self.reason = reason
            if self._remote is not None:
                if first:
                    self._stop_remote()
            elif self._proc is not None:
                _terminate(self._proc)

    def _stop_remote(self) -> None:
        assert self._remote is not None
        prefix, pid = self._remote
        proc = self._proc

        def kill() -> None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [*prefix, f"kill -TERM {pid}"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=REMOTE_GRACE_S,
                    check=False,
                )
            if proc is not None:
                try:
                    proc.wait(REMOTE_GRACE_S)
                except subprocess.TimeoutExpired:
                    _terminate(proc)

        threading.Thread(target=kill, name=f"calctl-lab-stop-{pid}", daemon=True).start()


#: How long a remote command is given to end after its SIGTERM before the local SSH client is ended instead.
REMOTE_GRACE_S = 30.0
_PID_LINE = "calctl-lab: pid "


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)


def remote_dir(board: LabBoard, stamp: str) -> str:
    """The run's directory on the board's host, as a shell word (``$TMPDIR`` is the host's, not ours)."""
    name = f"calctl-lab-{board.board_id.replace('/', '_').replace(':', '_')}-{stamp}"
    if board.workdir:
        return shlex.quote(str(PurePosixPath(board.workdir) / name))
    return '"${TMPDIR:-/tmp}"/' + shlex.quote(name)


def shell_command(board: LabBoard, command: LabCommand, run_dir: str) -> str:
    """One POSIX shell command line that runs ``command`` for ``board``, its evidence under ``run_dir`` (a shell
    word). The same line runs locally (``sh -c``) and over SSH."""
    report = run_dir if command.report == "dir" else f"{run_dir}/report.json"
    argv = [*shlex.split(board.calctl), *command.args]
    options = ["--device", board.device]
    if board.fault_plan:
        options += ["--fault-plan", board.fault_plan]
    options += ["--format", "junit" if command.junit else "json"]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in board.environment().items())
    words = " ".join(shlex.quote(a) for a in [*argv, *options])
    # The first line says the command's pid ($$: exec keeps it), so a stop can reach the command itself.
    return f'echo "{_PID_LINE}$$" >&2 && mkdir -p {run_dir} && exec env {env} {words} --report {report}'


def run_on_board(
    board: LabBoard,
    command: LabCommand,
    out_dir: Path,
    *,
    prefix: Sequence[str] = (),
    on_line: Callable[[str], None] | None = None,
    stopper: Stopper | None = None,
    keep_remote: bool = False,
    place: str | None = None,
) -> BoardRun:
    """Run ``command`` for ``board`` and leave its evidence in ``out_dir`` (created; must not hold a report).

    ``prefix`` empty: on this machine, writing straight into ``out_dir``. Else the command line is appended to
    ``prefix`` (an ``ssh ... host --`` prefix), runs in a directory on that host, and the directory comes back
    as a tar stream over the same connection (then is removed there unless ``keep_remote``). ``on_line`` gets
    each progress line (stderr) as it comes; stdout (JUnit or JSON) goes to ``junit.xml``/``stdout.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / BOARD_FILE, board.identity(place))  # the fleet report's row, even if the run never starts
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    remote = bool(prefix)
    run_dir = remote_dir(board, stamp) if remote else shlex.quote(str(out_dir.resolve()))
    line = shell_command(board, command, run_dir)
    argv = [*prefix, line] if remote else ["sh", "-c", line]
    run = BoardRun(board, out_dir, command.args)
    stdout_file = out_dir / (JUNIT_FILE if command.junit else "stdout.json")
    t0 = time.monotonic()
    run.started_at = time.time()
    try:
        with open(out_dir / LOG_FILE, "w", encoding="utf-8") as log, open(stdout_file, "wb") as sink:
            run.exit_code = _stream(argv, sink, log, on_line, stopper, prefix)
    except OSError as e:  # ssh or sh missing, out_dir unwritable
        run.infra_error = f"could not start {argv[0]}: {e.strerror or e}"
        return _finish(run, t0)
    if remote and run.exit_code != 255:
        fetched = fetch_dir(prefix, run_dir, out_dir, keep_remote=keep_remote)
        if fetched is not None and run.infra_error is None:
            run.infra_error = fetched
    if stopper is not None and stopper.reason is not None:
        run.infra_error = stopper.reason
    elif run.exit_code in _TRANSPORT_CODES:
        run.infra_error = f"{_TRANSPORT_CODES[run.exit_code]} (exit {run.exit_code}): {_last_line(out_dir / LOG_FILE)}"
    elif run.infra_error is None and not run.report_json.is_file() and run.exit_code == 2:
        run.infra_error = f"calctl refused the command (exit 2, a usage error): {_last_line(out_dir / LOG_FILE)}"
    elif run.infra_error is None and not run.report_json.is_file():
        run.infra_error = f"the command left no report.json (exit {run.exit_code}): {_last_line(out_dir / LOG_FILE)}"
    return _finish(run, t0)


def unreachable(board: LabBoard, command: LabCommand, out_dir: Path, reason: str) -> BoardRun:
    """The run of a board whose host could not be reached: its directory says who and why, nothing ran."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / BOARD_FILE, board.identity())
    run = BoardRun(board, out_dir, command.args, infra_error=reason)
    run.started_at = time.time()
    return _finish(run, time.monotonic())


def _finish(run: BoardRun, t0: float) -> BoardRun:
    run.seconds = time.monotonic() - t0
    run.ended_at = time.time()
    if run.infra_error is None:
        run.verdict = _verdict(run.report_json)
    write_json(run.out_dir / RUN_FILE, run.document())
    return run


def _verdict(path: Path) -> str | None:
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    verdict = doc.get("verdict") if isinstance(doc, dict) else None
    return verdict if isinstance(verdict, str) else None


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no output)"
    errors = [x for x in lines if x.startswith("error:")]  # calctl's own error line, before its hint
    return (errors or lines or ["(no output)"])[-1][:300]


def _stream(
    argv: Sequence[str],
    sink: IO[bytes],
    log: IO[str],
    on_line: Callable[[str], None] | None,
    stopper: Stopper | None,
    prefix: Sequence[str] = (),
) -> int:
    """Run ``argv`` in its own process group: stdout into ``sink``, each stderr line into ``log`` and
    ``on_line`` as it comes. Returns the exit code (a signal's death as 128 + signal, as a shell says)."""
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.PIPE, start_new_session=True
    )
    if stopper is not None:
        stopper.attach(proc)
    try:
        assert proc.stderr is not None
        for raw in proc.stderr:
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            if text.startswith(_PID_LINE) and text[len(_PID_LINE) :].isdigit():
                if stopper is not None and prefix:
                    stopper.attach_remote(prefix, int(text[len(_PID_LINE) :]))
                continue
            log.write(text + "\n")
            log.flush()
            if on_line is not None:
                on_line(text)
        code = proc.wait()
    finally:
        if stopper is not None:
            stopper.attach(None)
        if proc.poll() is None:  # an exception in on_line: the command must not outlive its caller
            _terminate(proc)
            proc.wait()
    return code if code >= 0 else 128 - code


def fetch_dir(prefix: Sequence[str], run_dir: str, out_dir: Path, *, keep_remote: bool = False) -> str | None:
    """Bring ``run_dir`` (a shell word on the host behind ``prefix``) into ``out_dir`` as a tar stream; remove it
    there unless ``keep_remote``. None when it came back; else why not."""
    clean = "" if keep_remote else f" && rm -rf {run_dir}"
    line = f"cd {run_dir} && tar -cf - .{clean}"
    try:
        proc = subprocess.Popen(
            [*prefix, line], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as e:
        return f"could not fetch the report directory: {e.strerror or e}"
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                _extract(tar, member, out_dir)
    except (tarfile.TarError, OSError, ValueError) as e:
        proc.kill()
        proc.wait()
        return f"could not fetch the report directory from {run_dir}: {e}"
    finally:
        err = proc.stderr.read().decode("utf-8", errors="replace").strip() if proc.stderr else ""
    if proc.wait() != 0:
        return f"could not fetch the report directory {run_dir} (exit {proc.returncode}): {err[:300]}"
    return None


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, out_dir: Path) -> None:
    """One member of the fetched report: regular files and directories only, inside ``out_dir``."""
    rel = PurePosixPath(member.name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"refused {member.name!r}: outside the report directory")
    target = out_dir.joinpath(*[p for p in rel.parts if p != "."]) if rel.parts else out_dir
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
    elif member.isfile():
        target.parent.mkdir(parents=True, exist_ok=True)
        src = tar.extractfile(member)
        assert src is not None
        with open(target, "wb") as fh:
            while chunk := src.read(1 << 16):
                fh.write(chunk)
    else:
        raise ValueError(f"refused {member.name!r}: not a regular file or directory")


__all__ = [
    "COMMANDS",
    "JUNIT_FILE",
    "LOG_FILE",
    "RUN_FILE",
    "BoardRun",
    "LabBoard",
    "LabCommand",
    "Stopper",
    "board_from_params",
    "fetch_dir",
    "run_on_board",
    "shell_command",
    "unreachable",
]
