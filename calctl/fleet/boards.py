"""The boards this host has: from a boards file, from the shim's enumeration extension, or the one board of the
environment (docs/boards.md).

CalRT opens one device per process (001 §2.1), so several boards are several calctl processes, each with
its board's environment (``CALCTL_BOARD_ID``, ``CALRT_DEVICE``, ``CALCTL_MOCK_SEED``; calctl.runtime.selection).
This module says which boards there are and what environment and options each one's process gets:

* a **boards file** (``--boards-file PATH``, else ``$CALCTL_BOARDS``): YAML, read with the bounded loader
  (calctl.package.yamlsafe), ``boards:`` a list of ``{id, kind: mock|calrt, seed, fault_plan, device,
  library}``; every bad entry is refused naming the file, the field and the value (exit 2);
* else, for ``--device calrt``, the **shim's enumeration extension** when the library exports it
  (``calrt_ext_device_count`` / ``calrt_ext_device_name``, docs/calrt-c-abi.md §11): one board per name,
  its ``CALRT_DEVICE``;
* else the **one board of this process's environment** (what ``calctl device info`` shows).

Nothing here opens a device.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.errors import CalctlError, UsageError

BOARDS_ENV = "CALCTL_BOARDS"
#: The most boards one file may list (a rack has tens; a typo should not start thousands of processes).
MAX_BOARDS = 256
MAX_BOARDS_FILE_BYTES = 256 * 2**10
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}")
_KEYS = {"id", "kind", "seed", "fault_plan", "device", "library", "place"}
_MOCK_ONLY = ("seed", "fault_plan")
_CALRT_ONLY = ("device", "library")


@dataclass(frozen=True)
class Board:
    """One board: its id (``CALCTL_BOARD_ID``), its kind, and what its process is given."""

    id: str
    kind: str = "mock"  # mock | calrt
    seed: int | None = None  # mock: CALCTL_MOCK_SEED
    fault_plan: Path | None = None  # mock: --fault-plan
    device: str | None = None  # calrt: CALRT_DEVICE handed to the shim
    library: Path | None = None  # calrt: --calrt-lib
    place: str | None = None  # where it is (a host name, a rack slot): shown, never used
    source: str = "environment"  # where the board was listed: a boards file, the shim's enumeration, the environment

    @property
    def dir_name(self) -> str:
        """The name of this board's report directory under the fleet's: its id with ``/`` as ``_`` (a label may
        hold ``/``; a report directory never nests, nor leaves the fleet's directory)."""
        return self.id.replace("/", "_")

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment of this board's calctl process: ``base`` with the board's variables (and none of
        another board's)."""
        from calctl.runtime.selection import BOARD_ID_ENV, CALRT_DEVICE_ENV, MOCK_SEED_ENV

        env = {k: v for k, v in base.items() if k not in (BOARD_ID_ENV, CALRT_DEVICE_ENV, MOCK_SEED_ENV)}
        env[BOARD_ID_ENV] = self.id
        if self.kind == "mock" and self.seed is not None:
            env[MOCK_SEED_ENV] = str(self.seed)
        if self.kind == "calrt" and self.device is not None:
            env[CALRT_DEVICE_ENV] = self.device
        return env

    def options(self) -> list[str]:
        """The device options of this board's calctl process (they replace the command line's own)."""
        out = ["--device", self.kind]
        if self.kind == "calrt" and self.library is not None:
            out += ["--calrt-lib", str(self.library)]
        if self.kind == "mock" and self.fault_plan is not None:
            out += ["--fault-plan", str(self.fault_plan)]
        return out

    def document(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "seed": self.seed,
            "fault_plan": str(self.fault_plan) if self.fault_plan is not None else None,
            "device": self.device,
            "library": str(self.library) if self.library is not None else None,
            "place": self.place,
            "source": self.source,
        }


# ---------------------------------------------------------------------------
# The boards file


def load_boards_file(path: Path) -> list[Board]:
    """The boards of a boards file. UsageError (exit 2) naming the file, the field and the value."""
    from calctl.package import yamlsafe

    where = str(path)
    try:
        doc = yamlsafe.load_file(path, display=where, max_bytes=MAX_BOARDS_FILE_BYTES)
    except UsageError:
        raise
    except (OSError, ValueError) as exc:
        raise UsageError(f"boards file {where}: {exc}") from None
    except CalctlError as exc:  # yamlsafe's refusals (a package's exit code): a boards file is a usage error
        raise UsageError(f"boards file {exc}" if where in str(exc) else f"boards file {where}: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("boards"), list):
        raise UsageError(f"boards file {where}: expected a mapping with a 'boards' list (docs/boards.md)")
    extra = sorted(set(doc) - {"boards", "schema"})
    if extra:
        raise UsageError(f"boards file {where}: unknown top-level key(s) {extra}; expected 'boards'")
    entries = doc["boards"]
    if not entries:
        raise UsageError(f"boards file {where}: 'boards' lists no board")
    if len(entries) > MAX_BOARDS:
        raise UsageError(f"boards file {where}: {len(entries)} boards, more than the {MAX_BOARDS} one file may list")
    boards = [_board(e, f"{where}: boards[{i}]", path.parent) for i, e in enumerate(entries)]
    seen: dict[str, int] = {}
    for i, b in enumerate(boards):
        if b.id in seen:
            raise UsageError(f"{where}: boards[{i}].id {b.id!r}: already the id of boards[{seen[b.id]}]")
        seen[b.id] = i
    selectors = [(b.kind, b.device or "default") for b in boards if b.kind == "calrt"]
    for s in set(selectors):
        if selectors.count(s) > 1:
            raise UsageError(
                f"{where}: two calrt boards with device {s[1]!r}: one board is never run by two processes (001 §2.1)"
            )
    return boards


def _board(entry: object, where: str, base: Path) -> Board:
    if not isinstance(entry, Mapping):
        raise UsageError(f"{where}: expected a mapping with id and kind, got {type(entry).__name__}")
    unknown = sorted(str(k) for k in set(entry) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field(s) {unknown}; expected {sorted(_KEYS)}")
    bid = entry.get("id")
    if not isinstance(bid, str) or not _LABEL.fullmatch(bid):
        raise UsageError(
            f"{where}.id: {bid!r}: expected a board label of 1-64 letters, digits and . _ : / - (CALCTL_BOARD_ID)"
        )
    kind = entry.get("kind", "mock")
    if kind not in ("mock", "calrt"):
        raise UsageError(f"{where}.kind: {kind!r}: expected mock or calrt")
    wrong = [k for k in (_CALRT_ONLY if kind == "mock" else _MOCK_ONLY) if entry.get(k) is not None]
    if wrong:
        raise UsageError(f"{where}.{wrong[0]}: applies to kind {'calrt' if kind == 'mock' else 'mock'} only")
    seed = entry.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise UsageError(f"{where}.seed: {seed!r}: expected a non-negative integer (CALCTL_MOCK_SEED)")
    device = entry.get("device")
    if device is not None and (not isinstance(device, str) or not device.strip() or not device.isprintable()):
        raise UsageError(f"{where}.device: {device!r}: expected the CALRT_DEVICE value (a PCI address or id)")
    place = entry.get("place")
    if place is not None and (not isinstance(place, str) or not place.isprintable()):
        raise UsageError(f"{where}.place: {place!r}: expected a host or place name")
    return Board(
        bid,
        kind,
        seed=seed,
        fault_plan=_file(entry.get("fault_plan"), f"{where}.fault_plan", base),
        device=device,
        library=_file(entry.get("library"), f"{where}.library", base),
        place=place,
        source="boards file",
    )


def _file(value: object, where: str, base: Path) -> Path | None:
    """A path of the boards file (relative to the file's directory), which must be a regular file."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise UsageError(f"{where}: {value!r}: expected a file path")
    p = Path(value)
    p = p if p.is_absolute() else base / p
    try:
        mode = p.stat().st_mode
    except OSError:
        raise UsageError(f"{where}: {value!r}: no such file ({p})") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{where}: {value!r}: not a regular file ({p})")
    return p.absolute()


# ---------------------------------------------------------------------------
# The shim's enumeration, and the environment's one board


def enumerate_shim(library: Path | str) -> list[Board] | None:
    """The boards the shim lists (``calrt_ext_device_count``/``calrt_ext_device_name``), or None when the library
    does not export the extension. A library that cannot be loaded: its LibraryError (exit 3)."""
    from calctl.runtime._native.lib import enumerate_devices, load_library

    lib = load_library(library)
    names = enumerate_devices(lib)
    if names is None:
        return None
    out = []
    for i, name in enumerate(names):
        bid = name if _LABEL.fullmatch(name) else f"board{i}"
        out.append(Board(bid, "calrt", device=name, library=Path(library).absolute(), source="shim enumeration"))
    return out


def environment_board(kind: str, library: Path | None, fault_plan: Path | None = None) -> Board:
    """The one board of this process's environment (``calctl device info``'s)."""
    from calctl.runtime import select_board

    sel = select_board(kind)
    if kind == "mock":
        return Board(sel.board, "mock", seed=sel.seed if sel.seed_from_env else None, fault_plan=fault_plan)
    return Board(sel.board, "calrt", device=sel.selector, library=library)


def host_boards(
    boards_file: Path | None, kind: str = "mock", library: Path | None = None, fault_plan: Path | None = None
) -> tuple[list[Board], str]:
    """(the boards, where they were listed): ``boards_file`` (else ``$CALCTL_BOARDS``), else the shim's enumeration
    for ``calrt`` when the library exports it, else the environment's one board."""
    if boards_file is None and os.environ.get(BOARDS_ENV):
        boards_file = Path(os.environ[BOARDS_ENV])
    if boards_file is not None:
        return load_boards_file(boards_file), f"boards file {boards_file}"
    if kind == "calrt":
        from calctl.runtime import CALRT_LIBRARY_ENV

        lib = library if library is not None else os.environ.get(CALRT_LIBRARY_ENV)
        if lib:
            listed = enumerate_shim(lib)
            if listed:
                return listed, f"the shim's enumeration ({lib})"
        lib_path = Path(lib) if lib else None
        return [environment_board(kind, lib_path)], "the environment (one board)"
    return [environment_board(kind, library, fault_plan)], "the environment (one board)"


def select(boards: Sequence[Board], spec: str, source: str) -> list[Board]:
    """``--boards all`` or ``--boards ID,ID``: the boards to run, in the given order. UsageError naming an unknown id."""
    text = spec.strip()
    if text == "all":
        return _distinct_dirs(list(boards))
    ids = [s.strip() for s in text.split(",") if s.strip()]
    if not ids:
        raise UsageError(f"--boards {spec!r}: expected all or a comma-separated list of board ids")
    by_id = {b.id: b for b in boards}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        known = ", ".join(by_id) or "none"
        raise UsageError(f"--boards: no board {unknown[0]!r} in {source}; the boards are: {known}")
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise UsageError(f"--boards: board {twice[0]!r} named twice (one process per board)")
    return _distinct_dirs([by_id[i] for i in ids])


def _distinct_dirs(boards: list[Board]) -> list[Board]:
    seen: dict[str, str] = {}
    for b in boards:
        if b.dir_name in seen:
            raise UsageError(
                f"--boards: boards {seen[b.dir_name]!r} and {b.id!r} would share the report directory {b.dir_name!r}"
            )
        seen[b.dir_name] = b.id
    return boards


__all__ = ["BOARDS_ENV", "Board", "enumerate_shim", "host_boards", "load_boards_file", "select"]
