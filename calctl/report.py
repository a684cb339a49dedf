"""The one report model: every command and runner returns a :class:`Report`; the CLI only renders it.

A report is a header (what ran, where, on which device and package), the steps
it took, one verdict in the vocabulary of docs/cli.md "Verdicts", the reasons the
verdict rests on, the command's own body, and the files it left behind (evidence
and pictures). The process exit code is never chosen by a command: it is
:func:`exit_code_of` the verdict, from the one table :data:`VERDICTS` below.

:func:`build_header` is the one header builder; its device block labels every
result with what produced it (a mock board, the reference board's software
model, a board through a vendor shim), so a mock result never reads as hardware
evidence (docs/runtime.md §5).

This module decides nothing about a run, prints nothing and imports no other
calctl folder (it sits with ``errors`` and ``records`` at the bottom of the tree).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

from calctl import __version__
from calctl.errors import ExitCode

# ---------------------------------------------------------------------------
# The verdict vocabulary (docs/cli.md "Verdicts") and the one place a verdict becomes an exit code.


class Tone(str, enum.Enum):
    """How a verdict word looks wherever it is shown: the terminal's colour (calctl.cli._output) and the page's
    class (calctl.html_report) are both read from :data:`VERDICTS`, so the two never disagree (#48 item 2)."""

    GOOD = "good"  # green: measured and met
    WARN = "warn"  # yellow: passed with something a person should look at
    BAD = "bad"  # red: failed, could not run, or stopped
    NEUTRAL = "neutral"  # no colour: nothing was judged (not measured, skipped, figures only, still running)


class VerdictWord(NamedTuple):
    """One word of the vocabulary: its exit code (None: not a run's final verdict), its tone and its meaning."""

    code: ExitCode | None
    tone: Tone
    meaning: str


_G, _W, _B, _N = Tone.GOOD, Tone.WARN, Tone.BAD, Tone.NEUTRAL

#: The one verdict table: verdict -> (exit code, tone, meaning). The exit code of every report, the terminal's
#: colour and the page's colour all come from here (tests/unit/test_verdict_table.py renders every word through
#: each renderer and fails on a word the code prints that is missing here). The tones, decided once:
#: * a non-zero exit code is always BAD (red): TIMEOUT, INTERNAL ERROR and F0 fail a run, never grey;
#: * WARN (yellow) is "exit 0, but a person should look": a named warning, a gate with too few samples, S1, F1,
#:   a refused optional call;
#: * NEUTRAL (grey) is "nothing was judged": figures only, not measured, skipped, still running, ask the vendor.
VERDICTS: dict[str, VerdictWord] = {
    "PASS": VerdictWord(ExitCode.OK, _G, "every check passed"),
    "WARN": VerdictWord(ExitCode.OK, _W, "passed, with warnings; every warning is named"),
    "FAIL": VerdictWord(ExitCode.FAILED, _B, "a check ran and failed (named)"),
    "NOT JUDGED": VerdictWord(ExitCode.OK, _W, "measured, but too few samples to judge a gate"),
    "MEASURED": VerdictWord(ExitCode.OK, _N, "figures only, no gate applies"),
    "ERROR": VerdictWord(ExitCode.DEVICE, _B, "the device or runtime failed"),
    "TIMEOUT": VerdictWord(ExitCode.TIMEOUT, _B, "a step hung past its deadline"),
    "INTERRUPTED": VerdictWord(ExitCode.INTERRUPTED, _B, "SIGINT or SIGTERM arrived"),
    "INTERNAL ERROR": VerdictWord(ExitCode.INTERNAL, _B, "a calctl bug; the report says where"),
    # 001 §17: a decision gate's Go condition met (G0-G5, and accept's M rows) / not met (the downgrade action).
    "GO": VerdictWord(ExitCode.OK, _G, "a decision gate (or every acceptance row) is met"),
    "NO-GO": VerdictWord(ExitCode.FAILED, _B, "a decision gate (or an acceptance row) is not met"),
    # Neutral, never green: a row that was not measured says nothing good about the board (#53 item 3).
    "NOT MEASURED": VerdictWord(ExitCode.OK, _N, "an acceptance row that was not measured, with why"),
    # 001 §1: S1 (service coexistence: both aliases Ready, the board may run them one after the other) is the
    # intermediate milestone, S2 (the chips' compute really overlaps) the goal; G3 of 001 §17 declares only S1
    # when S2 is not shown. So S1 is a pass to look at (yellow, exit 0 unless --require-s2), never red.
    "S1": VerdictWord(ExitCode.OK, _W, "service coexistence (001 §1)"),
    "S2": VerdictWord(ExitCode.OK, _G, "hardware concurrency (001 §1)"),
    # 001 §13.4: F0 (any runtime fault takes the whole board down, both aliases drained together) fails G4 of
    # 001 §17 ("at least F1"); F1 (requests and resources isolated, CCU/timeout/reset a shared fault domain) meets
    # it with a known limit; F2 (reset, unload and KV corruption never touch the other model) is the goal.
    "F0": VerdictWord(ExitCode.FAILED, _B, "fault isolation grade F0 (001 §13.4)"),
    "F1": VerdictWord(ExitCode.OK, _W, "fault isolation grade F1 (001 §13.4)"),
    "F2": VerdictWord(ExitCode.OK, _G, "fault isolation grade F2 (001 §13.4)"),
    # A check's or a row's word, never a run's final verdict (no exit code).
    "SKIP": VerdictWord(None, _N, "a step did not run; the detail says why"),
    "RUNNING": VerdictWord(None, _N, "a checkpoint of a run still going"),
    # The library answered NOT_SUPPORTED (or lacks an optional call): a finding about the library, never a pass
    # and never a failure of what it does offer (docs/calrt-c-abi.md §13); graded C4.
    "UNSUPPORTED": VerdictWord(None, _W, "the runtime refused or lacks the call; never counted as a pass"),
    # The grades of a vendor question (001 §1), as measured through the C ABI: C0 shown by evidence here; C1 the
    # symbol is there but its behaviour was not shown, C2 buildable on confirmed interfaces but not yet accepted
    # on hardware (both: look again); C3 needs something new from the vendor (not judged here: ask); C4 the
    # interface does not support it (a finding to act on, not a failed check: the suite still passes).
    "C0": VerdictWord(None, _G, "shown by evidence measured here (001 §1)"),
    "C1": VerdictWord(None, _W, "symbol present, behaviour not shown (001 §1)"),
    "C2": VerdictWord(None, _W, "buildable on confirmed interfaces, not yet accepted on hardware (001 §1)"),
    "C3": VerdictWord(None, _N, "needs a new vendor compiler, runtime or kernel: ask the vendor (001 §1)"),
    "C4": VerdictWord(None, _W, "the interface does not support it (001 §1)"),
    # ``calctl inspect``: the manifest as written, with no file hashed and no signature checked.
    "UNVERIFIED": VerdictWord(None, _W, "shown as written; contents not hashed, signature not checked"),
}


def tone_of(verdict: object) -> Tone:
    """The tone of a verdict word, or of a text that starts with one (``NO-GO on 1 of 11 rows``, ``FAIL: ...``);
    a text that starts with no word of the vocabulary is neutral."""
    word = str(verdict or "").strip().upper()
    for key in sorted(VERDICTS, key=len, reverse=True):  # INTERNAL ERROR before ERROR, NO-GO before GO
        if word == key or word.startswith((key + " ", key + ":", key + ",")):
            return VERDICTS[key].tone
    return Tone.NEUTRAL


def exit_code_of(verdict: str, *, fail_on: Iterable[str] = ()) -> int:
    """The documented exit code of a final ``verdict`` (docs/cli.md "Exit codes").

    ``fail_on`` names the verdicts this run's policy turns into a failed check (exit 1):
    ``WARN`` under ``--fail-on-warn``, ``S1`` under ``--require-s2``.
    """
    try:
        code = VERDICTS[verdict].code
    except KeyError:
        raise ValueError(f"verdict {verdict!r} is not in the vocabulary of docs/cli.md") from None
    if code is None:
        raise ValueError(f"verdict {verdict!r} is not a final verdict: it has no exit code")
    if code == ExitCode.OK and verdict in set(fail_on):
        return int(ExitCode.FAILED)
    return int(code)


#: Verdicts with exit 0 that are not a clean pass: the step ran and left something undecided or to look at.
_WARN_VERDICTS = frozenset({"WARN", "S1", "NOT JUDGED", "NOT MEASURED"})


def step_status_of(verdict: str, *, fail_on: Iterable[str] = ()) -> StepStatus:
    """The step word (:class:`StepStatus`) of a step whose own run ended with ``verdict``: the verdict itself
    when it is a step word; else by its exit code (:func:`exit_code_of`): a failed check (FAIL, NO-GO, F0) is
    FAIL, a run that could not measure (INTERNAL ERROR, ...) ERROR, a pass with something undecided (S1, NOT
    JUDGED) WARN, every other pass (GO, S2, MEASURED) PASS. The step keeps its own word as ``verdict``."""
    if verdict in StepStatus._value2member_map_ and verdict not in set(fail_on):
        return StepStatus(verdict)
    code = exit_code_of(verdict, fail_on=fail_on)
    if code == ExitCode.FAILED:
        return StepStatus.FAIL
    if code == ExitCode.TIMEOUT:
        return StepStatus.TIMEOUT
    if code == ExitCode.INTERRUPTED:
        return StepStatus.INTERRUPTED
    if code != ExitCode.OK:
        return StepStatus.ERROR
    return StepStatus.WARN if verdict in _WARN_VERDICTS else StepStatus.PASS


def verdict_of_exit_code(code: int) -> str:
    """The verdict an exit code stands for, when all that is known is the code (a child step, a refusal): the
    table's first word with that code (its plain words come first: PASS before GO, FAIL before NO-GO and F0);
    a code no verdict has (2, a usage error; a signal's) is ERROR."""
    return next((w for w, v in VERDICTS.items() if v.code is not None and int(v.code) == int(code)), "ERROR")


# ---------------------------------------------------------------------------
# The device label: what produced a result (docs/runtime.md §5, §7)

#: Printed on and stored in every report produced on the mock device (docs/runtime.md §5). It claims nothing
#: about the run (it is printed beside refusals and failures too, #53 item 7), only what produced it.
MOCK_LABEL = (
    "MOCK RESULT: produced on the simulated mock board, not on a Calculet board; "
    "it is not evidence about a board's hardware (docs/runtime.md §5)"
)

#: Printed on and stored in every report produced on the reference board (docs/runtime.md §7).
SOFTWARE_MODEL_LABEL = (
    "SOFTWARE MODEL RESULT: produced on the reference board, a software model of the board with no hardware; "
    "it is not evidence about a Calculet board (docs/runtime.md §7)"
)

#: ``runtime.firmware`` of the reference board (calrt_reference.c).
_SOFTWARE_MODEL_FIRMWARE = "software model"


class DeviceClass(str, enum.Enum):
    """What a result was produced on: the ``device_label`` of every header."""

    MOCK = "mock"
    SOFTWARE_MODEL = "software model"  # the reference board: the CalRT C ABI over a C model, no hardware
    BOARD = "board"  # a CalRT shim that does not say it is a model: a board
    UNKNOWN = "unknown"  # a remote server that did not say (bench --url without --target-device)


def device_class(kind: str | None, firmware: str | None = None, software_model: bool | None = None) -> DeviceClass:
    """What produced a result: the mock, a software model (the runtime says so: ``Versions.software_model``,
    from the shim's calrt_ext_device_identity; else its firmware says ``software model``), a board (a CalRT
    shim that says neither), or unknown (a CalRT shim whose versions were not read, a server)."""
    if kind == "mock":
        return DeviceClass.MOCK
    if kind == "calrt" and software_model is not None:
        return DeviceClass.SOFTWARE_MODEL if software_model else DeviceClass.BOARD
    if kind == "calrt" and firmware:
        return DeviceClass.SOFTWARE_MODEL if _SOFTWARE_MODEL_FIRMWARE in firmware else DeviceClass.BOARD
    return DeviceClass.UNKNOWN


def device_note(cls: DeviceClass) -> str | None:
    """The label a report prints beside its verdict: None for a board, and for a device not identified
    (its ``device_label`` says ``unknown``; a command that knows more says so in its own note)."""
    return {DeviceClass.MOCK: MOCK_LABEL, DeviceClass.SOFTWARE_MODEL: SOFTWARE_MODEL_LABEL}.get(cls)


# ---------------------------------------------------------------------------
# The one header builder


def versions_document(versions: Any) -> dict[str, Any] | None:
    """``{"runtime", "driver", "firmware", "abi", "software_model"}`` of a runtime's versions (an object or a
    mapping; ``software_model`` only when the runtime told, calctl.runtime.types.Versions)."""
    if versions is None:
        return None
    keys = ("runtime", "driver", "firmware", "abi", "software_model")
    get = versions.get if isinstance(versions, Mapping) else lambda k: getattr(versions, k, None)
    doc = {k: get(k) for k in keys}
    if doc["software_model"] is None:
        del doc["software_model"]
    return doc


def build_header(
    command: str,
    *,
    started_at: datetime | None = None,
    device: str | None = None,
    device_options: Mapping[str, Any] | None = None,
    versions: Any = None,
    package: Any = None,
    validation: Mapping[str, Any] | None = None,
    mock_result: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The block every report starts with: what ran (command, calctl version, when) and, for a command
    that used a device, which device, its label, its runtime versions, the package and its validation.

    ``device`` is the device kind (``mock``, ``calrt``, or what a remote server is said to run on);
    ``mock_result`` overrides the mock flag where the kind alone does not say (a remote server: None).
    ``extra`` keys follow, in order (a runner's own settings: level, seed, scenario, ...).
    """
    head: dict[str, Any] = {
        "command": command,
        "calctl_version": __version__,
        "started_at": (started_at or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
    }
    if device is not None:
        runtime = versions_document(versions)
        cls = device_class(
            device, runtime.get("firmware") if runtime else None, runtime.get("software_model") if runtime else None
        )
        if mock_result:
            cls = DeviceClass.MOCK
        mock = mock_result if mock_result is not None else {"mock": True, "calrt": False}.get(device)
        head.update(
            device=device,
            device_label=cls.value,
            mock_result=mock,
            note=device_note(cls),
            device_options=dict(device_options) if device_options is not None else None,
            runtime=runtime,
        )
    if package is not None:
        head["package"] = package
    if validation is not None:
        head["validation"] = dict(validation)
    head.update(extra)
    return head


# ---------------------------------------------------------------------------
# The report


class StepStatus(str, enum.Enum):
    """The status of one step of a run (docs/cli.md "Verdicts": the words a step may carry)."""

    PASS = "PASS"
    WARN = "WARN"  # done, with something a person should look at
    FAIL = "FAIL"
    SKIP = "SKIP"  # not run; the detail says why
    TIMEOUT = "TIMEOUT"
    ERROR = "ERROR"
    INTERRUPTED = "INTERRUPTED"


@dataclass(frozen=True)
class StepRecord:
    """One step of a run: its name, status, duration and what it found."""

    name: str
    status: StepStatus
    seconds: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
        }


class ReportStep(Protocol):
    """What a report needs of a step: a name, a duration and its JSON form (``name``, ``status``, ...).

    :class:`StepRecord` for a device run; a pipeline's richer steps (bringup, accept) carry their own
    verdict word, key figure and files.
    """

    @property
    def name(self) -> str: ...

    @property
    def seconds(self) -> float: ...

    def to_dict(self) -> dict[str, Any]: ...


#: Keys the model writes into every document; a body may not set them.
RESERVED = frozenset({"schema_version", "verdict", "exit_code"})
#: The header's labels of what produced a result (mock, software model, board); a body may not change them.
#: (``note`` is not one: a body may extend it, as ``device conformance`` does, keeping the label first.)
LABELS = frozenset({"device_label", "mock_result"})


@dataclass(frozen=True)
class Report:
    """What every command and runner returns, and all a renderer (table, JSON, JUnit, HTML) needs.

    ``header`` comes from :func:`build_header`; ``steps`` are the run's steps in the order they ran
    (``None``: the command has no steps); ``body`` is the command's own typed content (dataclasses and
    enums are turned into JSON by :func:`calctl.records.dumps`); ``reasons`` are what the verdict rests
    on, in words; ``evidence`` and ``pictures`` name the files the run wrote (name -> path).
    ``fail_on`` is the run's policy (:func:`exit_code_of`). ``error`` is the one-line cause that ended
    the run early, if one did. ``events`` are the runtime's per-chip job intervals of a device run: not
    part of the document (the trace writer turns them into files).
    """

    command: str
    verdict: str
    header: Mapping[str, Any] = field(default_factory=dict)
    body: Mapping[str, Any] = field(default_factory=dict)
    steps: tuple[ReportStep, ...] | None = None
    reasons: tuple[str, ...] = ()
    error: str | None = None
    seconds: float | None = None
    evidence: Mapping[str, str] = field(default_factory=dict)
    pictures: Mapping[str, str] = field(default_factory=dict)
    fail_on: frozenset[str] = frozenset()
    events: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        clash = RESERVED & set(self.body)
        if clash:
            raise ValueError(f"report body sets {sorted(clash)}: the model writes those")
        # The header's labels say what produced the result (docs/cli.md, the common fields): a body may repeat
        # them, never change them (a scenario's body once relabelled a mock run with a sentence).
        relabelled = sorted(
            k for k in LABELS & set(self.body) if self.header.get(k) is not None and self.body[k] != self.header[k]
        )
        if relabelled:
            raise ValueError(f"report body changes the header's {relabelled}")
        if self.verdict != "RUNNING":
            exit_code_of(self.verdict, fail_on=self.fail_on)  # a word outside the vocabulary is a calctl bug

    @property
    def exit_code(self) -> int:
        """The process exit code: :func:`exit_code_of` the verdict (a checkpoint's RUNNING: 0)."""
        if self.verdict == "RUNNING":
            return int(ExitCode.OK)
        return exit_code_of(self.verdict, fail_on=self.fail_on)

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    def document(self) -> dict[str, Any]:
        """The JSON document (before :func:`calctl.records.dumps` adds ``schema_version``)."""
        doc: dict[str, Any] = {
            **self.header,
            "command": self.header.get("command", self.command),
            "verdict": self.verdict,
            "exit_code": None if self.verdict == "RUNNING" else self.exit_code,
        }
        if self.reasons:
            doc["reasons"] = list(self.reasons)
        if self.steps is not None:
            doc["error"] = self.error
            if self.seconds is not None:
                doc["seconds"] = round(self.seconds, 3)
            doc["steps"] = [s.to_dict() for s in self.steps]
        elif self.error is not None:
            doc["error"] = self.error
        if self.seconds is not None and "seconds" not in doc:
            doc["seconds"] = round(self.seconds, 3)
        if self.evidence:
            doc["evidence"] = dict(self.evidence)
        if self.pictures:
            doc["pictures"] = dict(self.pictures)
        doc.update(self.body)
        return doc

    def replace(self, **changes: Any) -> Report:
        return dataclasses.replace(self, **changes)

    def with_body(self, **extra: Any) -> Report:
        return dataclasses.replace(self, body={**self.body, **extra})


def simple_report(command: str, body: Mapping[str, Any], *, verdict: str = "PASS", **header: Any) -> Report:
    """The report of a command that does one thing and has no steps (keygen, pack, inspect, rules, ...)."""
    return Report(command, verdict, build_header(command, **header), body)


__all__ = [
    "MOCK_LABEL",
    "RESERVED",
    "SOFTWARE_MODEL_LABEL",
    "VERDICTS",
    "DeviceClass",
    "Report",
    "ReportStep",
    "StepRecord",
    "StepStatus",
    "Tone",
    "VerdictWord",
    "build_header",
    "device_class",
    "device_note",
    "exit_code_of",
    "simple_report",
    "step_status_of",
    "tone_of",
    "verdict_of_exit_code",
    "versions_document",
]
