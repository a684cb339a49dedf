"""The child-process runner: :func:`run_suite` runs the checks in ``python -m calctl.runtime.conformance``,
one after another, each bounded; a hung or dead child becomes a row."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.records import dumps
from calctl.runtime import DeviceKind, open_runtime
from calctl.runtime._native.lib import CALL_LOG_ENV
from calctl.runtime.conformance.framework import (
    _MARK,
    CHECKS,
    DEFAULT_CHECK_TIMEOUT,
    CheckResult,
    ConformanceCheck,
    ConformanceLevel,
    ConformanceTarget,
    Verdict,
    checks_for,
    run_check,
)


@dataclass(frozen=True)
class ConformanceSuiteResult:
    """The rows of one suite run (a result body: ``calctl device conformance`` makes the report of it)."""

    target: ConformanceTarget
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """The suite's one pass rule: every check PASS or UNSUPPORTED (a refusal is a finding, not a failure)."""
        return all(r.verdict in (Verdict.PASS, Verdict.UNSUPPORTED) for r in self.results)

    def counts(self) -> dict[str, int]:
        return {v.value: sum(1 for r in self.results if r.verdict is v) for v in Verdict}


def run_suite(
    target: ConformanceTarget,
    names: Sequence[str] | None = None,
    *,
    check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    on_result: Callable[[CheckResult], None] | None = None,
) -> ConformanceSuiteResult:
    """Run the checks in child processes, each bounded by ``check_timeout`` seconds."""
    todo = [c for c in checks_for(target.device) if names is None or c.name in names]
    results: list[CheckResult] = []
    while todo:
        got = _run_child(target, todo, check_timeout, on_result)
        results.extend(got)
        todo = todo[len(got) :]
    return ConformanceSuiteResult(target, tuple(results))


def _run_child(
    target: ConformanceTarget,
    todo: list[ConformanceCheck],
    check_timeout: float,
    on_result: Callable[[CheckResult], None] | None,
) -> list[CheckResult]:
    spec = _line({**target.describe(), "checks": [c.name for c in todo]})
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryDirectory(prefix="calctl-conformance-") as tmp:
        calls = Path(tmp) / "calls.log"  # the child's CalRT calls, one line each, written before the call
        proc = subprocess.Popen(
            [sys.executable, "-m", "calctl.runtime.conformance", spec],
            env={**os.environ, CALL_LOG_ENV: str(calls)},
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group: a hung child is killed with whatever it started
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def reader() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(_MARK):
                    lines.put(line[len(_MARK) :])
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        results: list[CheckResult] = []
        try:
            for c in todo:
                bound = c.timeout(target.level, check_timeout)  # a long run at --level long gets its own
                started = time.monotonic()
                deadline = started + bound + 30  # startup and imports get their own margin
                begun = False
                result: CheckResult | None = None
                while result is None:
                    try:
                        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        why = f"did not finish within {bound:g} s; the check's process was killed"
                        if not begun:
                            why = "the check's process did not start it in time"
                        result = _lost(c, Verdict.TIMEOUT, started, why, _last_call(calls) if begun else None)
                        break
                    if line is None:
                        proc.wait(10)
                        err.seek(0)
                        exit_text = _exit_text(proc.returncode)
                        result = _lost(
                            c,
                            Verdict.FAIL,
                            started,
                            f"the check's process died ({exit_text})",
                            _last_call(calls) if begun else None,
                            tail=err.read()[-600:].strip(),
                            returned=exit_text,
                        )
                        break
                    doc = json.loads(line)
                    if doc.get("event") == "precondition":  # another process holds the board: no check can run
                        from calctl.runtime.board_lock import BoardLocked

                        raise BoardLocked(doc["message"], hint=doc.get("hint"))
                    if doc.get("event") == "begin":
                        begun, started, deadline = True, time.monotonic(), time.monotonic() + bound
                    else:
                        result = CheckResult.from_dict(doc["result"])
                results.append(result)
                if on_result is not None:
                    on_result(result)
                if (
                    result.verdict is Verdict.TIMEOUT
                    or result.evidence.get("abandoned")
                    or (result.verdict is Verdict.FAIL and proc.poll() is not None)
                ):
                    break
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return results


def _lost(
    c: ConformanceCheck,
    verdict: Verdict,
    started: float,
    why: str,
    last: tuple[str, str] | None,
    *,
    tail: str = "",
    returned: str | None = None,
) -> CheckResult:
    """The result of a check whose process stopped answering: why, the CalRT call it was in, its stderr tail, and
    the clauses the check tries (a crash inside one of them is that clause's FAIL as much as a wrong answer is)."""
    detail = why + (f" {last[1]}" if last else "") + (f": {tail}" if tail else "")
    return CheckResult(
        c.name,
        c.title,
        verdict,
        time.monotonic() - started,
        detail,
        call=last[0] if last else None,
        returned=returned,
        clauses=c.clauses,
    )


def _last_call(path: Path) -> tuple[str, str] | None:
    """The CalRT call the child was in (from its call log): the call's name and how to say it."""
    from calctl.runtime._native import lib as L

    last = L.last_call(path)
    if last is None:
        return None
    name, returned = last
    return name, (f"after {name} returned (no CalRT call in progress)" if returned else f"inside {name}")


def _line(doc: dict[str, Any]) -> str:
    """One line of the parent/child protocol: calctl's one JSON form (:func:`calctl.records.dumps`), compact,
    without ``schema_version`` (the protocol is private to this module)."""
    return dumps(doc, versioned=False, indent=None)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit {code}"


def _child_main(spec_text: str) -> int:
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing shim leaves a row, not a core file
    spec = json.loads(spec_text)
    target = ConformanceTarget(
        DeviceKind(spec["device"]),
        Path(spec["package"]),
        Path(spec["library"]) if spec.get("library") else None,
        ConformanceLevel(spec.get("level", ConformanceLevel.QUICK.value)),
    )
    by_name = {c.name: c for c in CHECKS}
    from calctl.runtime._native import lib as L

    if target.device is DeviceKind.CALRT:  # precondition: the board is ours (one process per board, 001 §2.1)
        from calctl.runtime.board_lock import BoardLocked

        try:
            open_runtime("calrt", calrt_lib=target.library).close()
        except BoardLocked as exc:
            doc = {"event": "precondition", "message": exc.message, "hint": exc.hint}
            print(_MARK + _line(doc), flush=True)
            return 0
        except Exception:  # anything else is a check's finding, reported by the checks
            pass
    for name in spec["checks"]:
        log = L.call_log()
        if log is not None:
            log.truncate()  # the log names the calls of the check now running
        print(_MARK + _line({"event": "begin", "check": name}), flush=True)
        result = run_check(by_name[name], target)
        print(_MARK + _line({"event": "result", "result": result.to_dict()}), flush=True)
        if result.evidence.get("abandoned"):  # threads are stuck inside the library: this process is done
            sys.stdout.flush()
            os._exit(0)
    return 0
