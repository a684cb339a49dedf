"""``calctl lab run``'s work: reserve the places whose tags match, lock each, run, collect, unlock (docs/lab.md).

One labgrid reservation per matching place, each for that place by name (``name=<place>`` beside the tags),
so a run covers every board once: a place that is busy (another job holds it) is waited for, in the
coordinator's order (priority, then age), and two runs over the same boards take turns instead of failing.
Each allocated place is acquired (locked), its ``CalculetBoard`` read, the command started on the board's
host in its own thread (:func:`calctl.lab.board.run_on_board`), and the place released and its reservation
cancelled as soon as the board is done. With ``count`` below the number of matching places, the first
``count`` places to become free are used and the other reservations cancelled.

What goes wrong on the lab's side is an infrastructure error naming the place and the host, never a board
FAIL: a place allocated while its exporter is offline (labgrid#1477: the coordinator allocates it and the
lock takes no resource), an exporter that goes away while its board runs (the command is stopped with
SIGTERM so it writes what it has), an SSH host that cannot be reached or drops, a place not free before the
timeout. Everything runs in the caller's thread except the board commands; labgrid's session is not shared
with them.

This module imports labgrid (the ``lab`` extra). It writes each board's directory; the fleet report is the
caller's (:mod:`calctl.cli.lab_cmds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.errors import CalctlError, ExitCode, UsageError
from calctl.fleet import InfraError
from calctl.lab.board import BoardRun, LabBoard, LabCommand, Stopper, board_from_params, run_on_board

DEFAULT_COORDINATOR = "127.0.0.1:20408"
#: How often the coordinator is asked about the reservations (they expire after 60 s without a poll).
POLL_S = 0.5
RESOURCE_CLASS = "CalculetBoard"


class LabUnavailable(CalctlError):
    """The labgrid coordinator cannot be reached or refused a request (exit 3: the lab, not the boards)."""

    exit_code = ExitCode.DEVICE


@dataclass(frozen=True)
class LabRunPlan:
    """What ``calctl lab run`` was asked to do."""

    tags: dict[str, str]
    command: LabCommand
    out_dir: Path
    count: int | None = None  # None: every matching place
    timeout_s: float = 600.0  # how long to wait for places to become free
    priority: float = 0.0
    coordinator: str | None = None  # None: $LG_COORDINATOR, else 127.0.0.1:20408
    keep_remote: bool = False


@dataclass
class LabRunResult:
    runs: list[BoardRun] = field(default_factory=list)
    infra_errors: list[InfraError] = field(default_factory=list)
    places: list[str] = field(default_factory=list)  # the places that matched


@dataclass
class _PlaceSlot:
    """One place of the run: its reservation, and once locked its board and running command."""

    place: str
    token: str
    board_id: str
    where: str
    exporter: str | None = None
    resource: tuple[str, str, str] | None = None  # (exporter, group, name) of the CalculetBoard
    thread: threading.Thread | None = None
    stopper: Stopper = field(default_factory=Stopper)
    run: BoardRun | None = None
    acquired: bool = False
    done: bool = False


def parse_tags(text: str) -> dict[str, str]:
    """``board=calculet,rack=1`` as labgrid tags (its key rule: ``[a-z][a-z0-9_]+``)."""
    import re

    tags: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_]+", key) or not value:
            raise UsageError(
                f"--tags {text!r}: {pair!r} is not KEY=VALUE with a labgrid tag key (lower-case letters, digits, _; "
                "at least 2 characters)"
            )
        tags[key] = value
    if not tags:
        raise UsageError("--tags: expected at least one KEY=VALUE (e.g. --tags board=calculet,rack=1)")
    return tags


class LabSession:
    """The labgrid client session of one run (a thin layer over ``labgrid.remote.client``)."""

    def __init__(self, address: str) -> None:
        from labgrid.remote.client import start_session

        self.address = address
        try:
            self.session = start_session(address)
        except Exception as e:  # labgrid raises ConnectionRefusedError, ServerError or grpc's errors
            raise LabUnavailable(f"labgrid coordinator {address}: cannot connect ({e})") from e

    @property
    def places(self) -> dict[str, Any]:
        return self.session.places

    @property
    def lost(self) -> bool:
        return bool(self.session.stopping.is_set())

    def call(self, method: str, request: Any) -> Any:
        import grpc

        try:
            return self.session.loop.run_until_complete(getattr(self.session.stub, method)(request))
        except grpc.aio.AioRpcError as e:
            raise LabUnavailable(f"labgrid coordinator {self.address}: {method}: {e.details()}") from e

    def sync(self) -> None:
        self.session.loop.run_until_complete(self.session.sync_with_coordinator())

    def pump(self, seconds: float) -> None:
        self.session.loop.run_until_complete(asyncio.sleep(seconds))

    def resource(self, exporter: str, group: str, name: str) -> dict[str, Any]:
        entry = self.session.resources.get(exporter, {}).get(group, {}).get(name)
        return entry.data if entry is not None else {}

    def close(self) -> None:
        try:
            self.session.loop.run_until_complete(self.session.stop())
            self.session.loop.run_until_complete(self.session.close())
        except Exception:  # closing a session whose coordinator is gone: nothing left to tell it
            pass


def _board_resources(session: LabSession, place: Any) -> list[tuple[str, str, str]]:
    """(exporter, group, name) of every CalculetBoard the place matches, online or not (resources the client
    has heard of: an exporter that went away leaves its entries empty)."""
    found = []
    for exporter, groups in session.session.resources.items():
        for group, resources in groups.items():
            for name, entry in resources.items():
                cls = entry.data.get("cls", RESOURCE_CLASS)
                if cls == RESOURCE_CLASS and place.hasmatch((exporter, group, cls, name)):
                    found.append((exporter, group, name))
    return sorted(found)


def _identity(session: LabSession, place: Any) -> tuple[str, str, str | None]:
    """(board_id, "place P on host H", exporter) as far as the client knows before it locks the place."""
    for exporter, group, name in _board_resources(session, place):
        params = session.resource(exporter, group, name).get("params", {})
        board_id = params.get("board_id") or place.name
        return str(board_id), _where(place.name, exporter, params), exporter
    matches = ", ".join(repr(m) for m in place.matches) or "no match"
    return place.name, f"place {place.name} (no {RESOURCE_CLASS} online; its match: {matches})", None


def _where(place: str, exporter: str, params: dict[str, Any]) -> str:
    host = params.get("host") or (params.get("extra") or {}).get("proxy") or exporter
    return f"place {place} on host {host} (exporter {exporter})"


def run_lab(
    plan: LabRunPlan,
    *,
    on_line: Callable[[str, str], None] | None = None,
    prefix_for: Callable[[LabBoard, dict[str, Any]], list[str]] | None = None,
) -> LabRunResult:
    """Run ``plan`` over the lab; every board's directory is ``plan.out_dir/<board_id>/``.

    ``on_line(board_id, line)`` gets each progress line; ``prefix_for`` gives a board's command prefix (default
    :func:`calctl.lab.resource.command_prefix`, labgrid's SSH). A signal (KeyboardInterrupt) stops the running
    commands, releases the places and cancels the reservations before it propagates.
    """
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    if prefix_for is None:
        from calctl.lab.resource import command_prefix

        prefix_for = command_prefix
    session = LabSession(plan.coordinator or os.environ.get("LG_COORDINATOR") or DEFAULT_COORDINATOR)
    result = LabRunResult()
    slots: list[_PlaceSlot] = []
    try:
        matching = sorted(n for n, p in session.places.items() if plan.tags.items() <= p.tags.items())
        if not matching:
            known = sorted({f"{k}={v}" for p in session.places.values() for k, v in p.tags.items()})
            raise UsageError(
                f"--tags {','.join(f'{k}={v}' for k, v in plan.tags.items())}: no place of the lab at "
                f"{session.address} has these tags (tags in use: {', '.join(known) or 'none'})"
            )
        count = len(matching) if plan.count is None else plan.count
        if count > len(matching):
            raise UsageError(f"--count {count}: only {len(matching)} place(s) match the tags: {', '.join(matching)}")
        result.places = matching
        for name in matching:
            request = pb2.CreateReservationRequest(
                filters={"main": pb2.Reservation.Filter(filter={**plan.tags, "name": name})}, prio=plan.priority
            )
            token = session.call("CreateReservation", request).reservation.token
            board_id, where, exporter = _identity(session, session.places[name])
            slots.append(_PlaceSlot(name, token, board_id, where, exporter))
        _drive(session, plan, slots, count, result, on_line, prefix_for)
    finally:
        _stop_all(session, slots, result)
        session.close()
    result.runs.sort(key=lambda r: r.board.board_id)
    return result


def _drive(
    session: LabSession,
    plan: LabRunPlan,
    slots: list[_PlaceSlot],
    count: int,
    result: LabRunResult,
    on_line: Callable[[str, str], None] | None,
    prefix_for: Callable[[LabBoard, dict[str, Any]], list[str]],
) -> None:
    deadline = time.monotonic() + plan.timeout_s
    started = 0
    while True:
        if session.lost:
            raise LabUnavailable(f"labgrid coordinator {session.address}: the connection was lost during the run")
        for slot in slots:
            if slot.done or slot.acquired:
                continue
            if started >= count:  # --count reached: the other places are left to others
                _cancel_all(session, [slot])
            elif _allocated(session, slot, result):
                started += 1
                _lock_and_start(session, plan, slot, result, on_line, prefix_for)
        _watch_running(session, slots, result)
        waiting = [s for s in slots if not s.done and not s.acquired]
        running = [s for s in slots if s.acquired and not s.done]
        if not running and (not waiting or started >= count):
            _cancel_all(session, waiting)
            return
        if waiting and started < count and time.monotonic() > deadline:
            _give_up(session, plan, waiting, started, count, result)
            count = started
        session.pump(POLL_S)


def _allocated(session: LabSession, slot: _PlaceSlot, result: LabRunResult) -> bool:
    """Whether the slot's reservation is allocated to its place now (a lost reservation fails the slot)."""
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    try:
        reply = session.call("PollReservation", pb2.PollReservationRequest(token=slot.token)).reservation
    except LabUnavailable as e:  # the coordinator dropped it (restarted, or the place was deleted)
        slot.token = ""
        _fail(session, slot, result, f"the reservation was lost: {e}")
        return False
    return _is_allocated(reply) and dict(reply.allocations).get("main") == slot.place


def _watch_running(session: LabSession, slots: list[_PlaceSlot], result: LabRunResult) -> None:
    """Stop the command of a board whose exporter went away; collect every board command that ended."""
    for slot in slots:
        if slot.thread is not None and not slot.done and slot.resource is not None:
            data = session.resource(*slot.resource)
            if not data.get("cls") or not data.get("avail", False):
                slot.stopper.stop(f"its exporter {slot.exporter} went away during the run; the command was stopped")
    for slot in slots:
        if slot.thread is not None and not slot.done and not slot.thread.is_alive():
            _collect(session, slot, result)


def _give_up(
    session: LabSession, plan: LabRunPlan, waiting: list[_PlaceSlot], started: int, count: int, result: LabRunResult
) -> None:
    """--timeout passed with places still waited for: their infrastructure errors, their reservations cancelled."""
    held = ", ".join(s.place + _holder(session, s) for s in waiting)
    why = f"not free within --timeout {plan.timeout_s:g} s"
    if plan.count is None:  # every place was asked for: each one that never came is a row
        result.infra_errors += [InfraError(s.board_id, s.where, why + _holder(session, s)) for s in waiting]
    else:  # any N of them: one row per board short of N, naming the places still waited for
        tags = ",".join(f"{k}={v}" for k, v in plan.tags.items())
        result.infra_errors += [
            InfraError(f"(board {started + i + 1} of {count})", f"places tagged {tags}", f"{why} ({held})")
            for i in range(count - started)
        ]
    _cancel_all(session, waiting)


def _cancel_all(session: LabSession, slots: list[_PlaceSlot]) -> None:
    for slot in slots:
        _cancel(session, slot)
        slot.done = True


def _holder(session: LabSession, slot: _PlaceSlot) -> str:
    place = session.places.get(slot.place)
    return f" (held by {place.acquired})" if place is not None and place.acquired else ""


def _is_allocated(reply: Any) -> bool:
    from labgrid.remote.common import Reservation, ReservationState

    return Reservation.from_pb2(reply).state in (ReservationState.allocated, ReservationState.acquired)


def _lock_and_start(
    session: LabSession,
    plan: LabRunPlan,
    slot: _PlaceSlot,
    result: LabRunResult,
    on_line: Callable[[str, str], None] | None,
    prefix_for: Callable[[LabBoard, dict[str, Any]], list[str]],
) -> None:
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    session.call("AcquirePlace", pb2.AcquirePlaceRequest(placename=slot.place))
    slot.acquired = True
    session.sync()
    place = session.places[slot.place]
    boards = [tuple(p) for p in place.acquired_resources if len(p) == 4 and p[2] == RESOURCE_CLASS]
    if not boards:  # labgrid#1477: allocated and locked although its exporter is offline
        board_id, where, _ = _identity(session, place)
        slot.board_id, slot.where = board_id, where
        _fail(session, slot, result, "the place was allocated but its exporter is offline: no board to run on")
        return
    exporter, group, _, name = boards[0]
    data = session.resource(exporter, group, name)
    params = {k: v for k, v in data.get("params", {}).items() if k != "extra"}
    slot.resource, slot.exporter = (exporter, group, name), exporter
    slot.where = _where(slot.place, exporter, data.get("params", {}))
    slot.board_id = str(params.get("board_id") or slot.place)
    if not data.get("avail", False):
        _fail(session, slot, result, "the board's exporter says the resource is not available")
        return
    try:
        board = board_from_params(params)
    except UsageError as e:
        _fail(session, slot, result, f"the exporter's {RESOURCE_CLASS} is not valid: {e}")
        return
    try:
        prefix = prefix_for(board, data.get("params", {}).get("extra") or {})
    except Exception as e:  # labgrid's ExecutionError: the SSH master connection failed
        _fail(session, slot, result, f"cannot reach the host over SSH: {e}")
        return
    out = plan.out_dir / board.board_id.replace("/", "_")

    def line(text: str, board_id: str = board.board_id) -> None:
        if on_line is not None:
            on_line(board_id, text)

    def work() -> None:
        slot.run = run_on_board(
            board,
            plan.command,
            out,
            prefix=prefix,
            on_line=line,
            stopper=slot.stopper,
            keep_remote=plan.keep_remote,
            place=slot.where,
        )

    slot.thread = threading.Thread(target=work, name=f"calctl-lab-{board.board_id}", daemon=True)
    slot.thread.start()


def _fail(session: LabSession, slot: _PlaceSlot, result: LabRunResult, reason: str) -> None:
    result.infra_errors.append(InfraError(slot.board_id, slot.where, reason))
    _release(session, slot)
    slot.done = True


def _collect(session: LabSession, slot: _PlaceSlot, result: LabRunResult) -> None:
    run = slot.run
    if run is None:
        result.infra_errors.append(
            InfraError(slot.board_id, slot.where, "the board's command thread ended without a result")
        )
    elif run.infra_error is not None:
        result.infra_errors.append(InfraError(run.board.board_id, slot.where, run.infra_error))
        result.runs.append(run)
    else:
        result.runs.append(run)
    _release(session, slot)
    slot.done = True


def _release(session: LabSession, slot: _PlaceSlot) -> None:
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    if slot.acquired and not session.lost:
        with contextlib.suppress(LabUnavailable):  # already released (an operator's --kick): nothing to undo
            session.call("ReleasePlace", pb2.ReleasePlaceRequest(placename=slot.place))
        slot.acquired = False
    _cancel(session, slot)


def _cancel(session: LabSession, slot: _PlaceSlot) -> None:
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    if slot.token and not session.lost:
        with contextlib.suppress(LabUnavailable):  # expired or already cancelled
            session.call("CancelReservation", pb2.CancelReservationRequest(token=slot.token))
    slot.token = ""


def _stop_all(session: LabSession, slots: list[_PlaceSlot], result: LabRunResult) -> None:
    """On every way out: stop the commands still running, wait for them, release and cancel what is left."""
    for slot in slots:
        if slot.thread is not None and slot.thread.is_alive():
            slot.stopper.stop("calctl lab run was stopped before the board finished")
    for slot in slots:
        if slot.thread is not None and not slot.done:
            slot.thread.join()
            _collect(session, slot, result)
        elif not slot.done:
            _release(session, slot)
            slot.done = True


__all__ = ["DEFAULT_COORDINATOR", "LabRunPlan", "LabRunResult", "LabUnavailable", "parse_tags", "run_lab"]
