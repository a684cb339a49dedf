"""One calctl process per board, run concurrently, and their report directories merged (docs/boards.md).

CalRT opens one device per process (001 §2.1), so ``--boards`` runs the command once per board as a child
``python -m calctl`` with that board's environment (:meth:`Board.environment`) and device options, its
report into ``<out>/<board-id>/``, at most ``parallel`` at a time. Each child's stderr lines reach
``on_line`` as they come (the CLI prefixes them with the board id) and are kept in ``console.log`` beside
its report. A signal stops the fan-out: the children still running get SIGINT (they end INTERRUPTED and write
their partial reports), those not started never start, and the fleet report is still written.

A child that cannot start, dies of a signal or exits without a report is an infrastructure ERROR row
naming the host and why (the exit status and its last line), never a FAIL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from calctl.fleet.boards import Board
from calctl.fleet.merge import BOARD_FILE, FleetReport, InfraError, merge_reports, report_path

CONSOLE_LOG = "console.log"
#: Seconds the children get to write their partial reports after SIGINT, before SIGTERM, then SIGKILL.
STOP_GRACE_S = 60.0
KILL_GRACE_S = 10.0


@dataclass(frozen=True)
class ChildRun:
    """What to run for every board: the command's argv after ``calctl`` (without device, report and fleet options),
    and whether its ``--report`` names a file (``report.json`` in the board's directory) or the directory."""

    args: Sequence[str]
    report_is_dir: bool
    command: str
    files: Mapping[str, str] = field(default_factory=dict)  # option -> file name, written in the board's directory


@dataclass
class _Child:
    board: Board
    out: Path
    proc: subprocess.Popen[bytes] | None = None
    error: str | None = None
    tail: list[str] = field(default_factory=list)
    started: float = 0.0
    seconds: float = 0.0


def child_environment(board: Board, base: Mapping[str, str]) -> dict[str, str]:
    """The board's environment, with this calctl first on the child's import path (the child runs the same
    calctl as its parent, whatever else the environment's path holds)."""
    import calctl

    env = board.environment(base)
    root = str(Path(calctl.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, base.get("PYTHONPATH", "")) if p)
    return env


def child_argv(run: ChildRun, board: Board, board_dir: Path) -> list[str]:
    report = board_dir if run.report_is_dir else board_dir / "report.json"
    files = [x for option, name in run.files.items() for x in (option, str(board_dir / name))]
    return [sys.executable, "-m", "calctl", *run.args, *board.options(), *files, "--report", str(report)]


def run_boards(
    run: ChildRun,
    boards: Sequence[Board],
    out_dir: Path,
    *,
    parallel: int = 0,
    on_line: Callable[[str, str], None] = lambda board, line: None,
    environ: Mapping[str, str] | None = None,
) -> FleetReport:
    """Run ``run`` on every board (at most ``parallel`` at once; 0: all), then merge their reports into
    ``out_dir`` (fleet-report.json and .html). A KeyboardInterrupt (SIGINT/SIGTERM under calctl's handler)
    stops the children and is answered by an INTERRUPTED fleet report, not re-raised."""
    base = dict(os.environ if environ is None else environ)
    host = socket.gethostname()
    out_dir.mkdir(parents=True, exist_ok=True)
    children = [_Child(b, out_dir / b.dir_name) for b in boards]
    stop = threading.Event()
    interrupted: str | None = None
    width = parallel if parallel > 0 else len(children)
    pool = ThreadPoolExecutor(max_workers=max(1, width), thread_name_prefix="calctl-board")
    try:
        futures: list[Future[None]] = [pool.submit(_run_child, run, c, base, host, stop, on_line) for c in children]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
    except KeyboardInterrupt as exc:
        interrupted = str(getattr(exc, "signal_name", "") or "SIGINT")
        stop.set()
        _stop_children(children)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    errors = []
    for c in children:
        why = _infra_reason(c, interrupted)
        if why is not None:
            errors.append(InfraError(c.board.id, host, why))
    return merge_reports(
        [c.out for c in children], out_dir, infra_errors=errors, command=run.command, interrupted=interrupted
    )


def _run_child(
    run: ChildRun,
    child: _Child,
    base: Mapping[str, str],
    host: str,
    stop: threading.Event,
    on_line: Callable[[str, str], None],
) -> None:
    if stop.is_set():
        child.error = "not started: the fan-out was interrupted first"
        return
    from calctl.records import write_json

    board = child.board
    try:
        child.out.mkdir(parents=True, exist_ok=True)
        write_json(child.out / BOARD_FILE, {**board.document(), "host": host})
        argv = child_argv(run, board, child.out)
        child.started = time.monotonic()
        with (child.out / "stdout.txt").open("wb") as stdout, (child.out / CONSOLE_LOG).open("wb") as console:
            child.proc = subprocess.Popen(
                argv,
                env=child_environment(board, base),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
            )
            assert child.proc.stderr is not None
            for raw in child.proc.stderr:
                console.write(raw)
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                child.tail = [*child.tail[-19:], line]
                on_line(board.id, line)
            child.proc.wait()
    except OSError as exc:
        child.error = f"the board's calctl process could not start: {exc.strerror or exc}"
    finally:
        child.seconds = time.monotonic() - child.started if child.started else 0.0


def _stop_children(children: Sequence[_Child]) -> None:
    """SIGINT to every running child; SIGTERM after STOP_GRACE_S, SIGKILL after KILL_GRACE_S more."""
    running = [c.proc for c in children if c.proc is not None and c.proc.poll() is None]
    for p in running:
        _send(p, signal.SIGINT)
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        deadline = time.monotonic() + grace
        for p in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        running = [p for p in running if p.poll() is None]
        for p in running:
            _send(p, sig)
    for p in running:
        p.wait()


def _send(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _infra_reason(child: _Child, interrupted: str | None) -> str | None:
    """Why the board's run did not complete (None: it left a report, whatever its verdict)."""
    if child.error is not None:
        return child.error
    proc = child.proc
    if proc is None:
        return "not started: the fan-out was interrupted first" if interrupted else "not started"
    rc = proc.returncode
    has_report = report_path(child.out) is not None
    said = [line.strip() for line in child.tail if line.strip()]
    # the child's own error line (calctl prints "error: ..." then a hint), else its last line
    last = next((line for line in reversed(said) if line.startswith("error:")), said[-1] if said else "")
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
        if has_report and interrupted:
            return None  # stopped by the fan-out after it wrote its partial report
        return f"the board's calctl process died of {name}" + (f"; its last line: {last}" if last else "")
    if not has_report:
        return f"the board's calctl process exited {rc} without a report" + (f": {last}" if last else "")
    return None


__all__ = ["CONSOLE_LOG", "ChildRun", "child_argv", "run_boards"]
