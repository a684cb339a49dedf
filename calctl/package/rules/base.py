"""The vocabulary of validation rules: groups, severities, statuses, findings, the Rule base.

A rule is a small class: a stable ``id`` (``CHIP003``), its ``group``, a
``severity``, a one-line docstring (the summary people see in ``calctl rules``),
an ``explanation`` citing the report section it enforces, the facts it
``needs`` and a ``check(ctx)`` generator of :class:`Finding`. The runner in
:mod:`calctl.package.validate` turns findings into report entries; a rule never
prints, never raises for a bad package and never decides exit codes.

This module holds no rule and reads no file.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from calctl.package.model import MANIFEST

if TYPE_CHECKING:  # pragma: no cover - typing only
    from calctl.package.rules.context import ValidationContext


class Severity(str, enum.Enum):
    """What a violated rule means for the package: ``error`` rejects it, ``warning`` does not."""

    ERROR = "error"
    WARNING = "warning"


class Status(str, enum.Enum):
    """Outcome of one check entry. ``error`` means the rule itself could not decide (a crash)."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}


class Group(str, enum.Enum):
    """The rule groups of docs/validate.md, in report order."""

    LAYOUT = "layout"
    MANIFEST = "manifest"
    HASH = "hash"
    SIGNATURE = "signature"
    CHIP = "chip"
    ELF = "elf"
    MEMORY = "memory"
    TENSORS = "tensors"
    TOKENIZER = "tokenizer"
    COMPAT = "compat"

    @property
    def label(self) -> str:
        return _TITLES[self]


_TITLES = {
    Group.LAYOUT: "Layout and path safety",
    Group.MANIFEST: "Manifest",
    Group.HASH: "Hashes",
    Group.SIGNATURE: "Signature",
    Group.CHIP: "Chip masks and targets",
    Group.ELF: "ELF programs",
    Group.MEMORY: "Memory plan",
    Group.TENSORS: "Tensors and golden data",
    Group.TOKENIZER: "Tokenizer",
    Group.COMPAT: "Compatibility and provenance",
}

#: The ID prefixes of each group: a rule's group is the one its ID starts with.
PREFIXES: dict[Group, tuple[str, ...]] = {
    Group.LAYOUT: ("LAY",),
    Group.MANIFEST: ("MAN",),
    Group.HASH: ("HASH",),
    Group.SIGNATURE: ("SIG",),
    Group.CHIP: ("CHIP",),
    Group.ELF: ("ELF",),
    Group.MEMORY: ("MEM",),
    Group.TENSORS: ("GOLD",),
    Group.TOKENIZER: ("TOK",),
    Group.COMPAT: ("COMP", "PROV"),
}
_GROUP_OF = {prefix: group for group, prefixes in PREFIXES.items() for prefix in prefixes}


class Need(str, enum.Enum):
    """Facts a rule cannot run without; when one is missing the runner reports a skip with the reason."""

    ROOT = "root"  # the package directory (an archive was extracted, or a directory was given)
    MANIFEST = "manifest"  # the typed Package (manifest parsed and schema-valid, MAN001)
    CHECKSUMS = "checksums"  # checksums.sha256 parsed (HASH001)
    COMPATIBILITY = "compatibility"  # compatibility.json parsed and schema-valid (COMP001)
    PROVENANCE = "provenance"  # build-provenance.json parsed and schema-valid (PROV001)


def show(value: Any) -> str:
    """Render an expected/found value compactly for messages and JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(show(v) for v in items) + "]"
    return str(value)


@dataclass(frozen=True)
class Finding:
    """One observation of a rule: a problem, a skip with its reason, or a pass note."""

    status: Status
    message: str
    file: str | None = None
    field: str | None = None
    expected: str | None = None
    found: str | None = None


class Rule:
    """Base of every rule. Subclasses set the class attributes and implement :meth:`check`.

    The docstring's first line is the summary, the paragraph after it the ``explanation``; ``group``
    defaults to the group whose prefix (:data:`PREFIXES`) starts the ID.
    """

    id: ClassVar[str]
    group: ClassVar[Group]
    severity: ClassVar[Severity] = Severity.ERROR
    #: Report sections the rule enforces, e.g. ``("001 §6.2 item 4",)``.
    sections: ClassVar[tuple[str, ...]] = ()
    #: Longer explanation for ``calctl explain`` and docs/rules.md: by default the docstring after its first
    #: line, its lines joined by single spaces.
    explanation: ClassVar[str] = ""
    needs: ClassVar[frozenset[Need]] = frozenset({Need.ROOT})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        doc = (cls.__doc__ or "").strip()
        if "explanation" not in cls.__dict__ and "\n" in doc:
            cls.explanation = " ".join(doc.split("\n", 1)[1].split())
        prefix = cls.__dict__.get("id", "").rstrip("0123456789")
        if prefix in _GROUP_OF and "group" not in cls.__dict__:
            cls.group = _GROUP_OF[prefix]

    @classmethod
    def summary(cls) -> str:
        """The first line of the class docstring."""
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else cls.id

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers for subclasses ------------------------------------------------

    def problem(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> Finding:
        """A violation: ``fail`` for an error-severity rule, ``warn`` for a warning one."""
        status = Status.FAIL if self.severity is Severity.ERROR else Status.WARN
        return self._finding(status, message, file, field, expected, found)

    def manifest_problem(
        self, message: str, *, field: str | None = None, expected: Any = None, found: Any = None
    ) -> Finding:
        """A violation in manifest.yaml at ``field`` (a JSON-pointer-like location): :meth:`problem` of that file."""
        return self.problem(message, file=MANIFEST, field=field, expected=expected, found=found)

    def differs(
        self, found: Any, expected: Any, message: str, *, file: str | None = MANIFEST, field: str | None = None
    ) -> Iterator[Finding]:
        """:meth:`problem` (both values shown) when ``found`` is not ``expected``; nothing when they agree."""
        if found != expected:
            yield self.problem(message, file=file, field=field, expected=expected, found=found)

    def warning(self, message: str, *, file: str | None = None, field: str | None = None) -> Finding:
        """A violation the policy explicitly downgraded (e.g. ``--allow-unsigned``)."""
        return Finding(Status.WARN, message, file, field)

    def skip(self, reason: str, *, file: str | None = None, field: str | None = None) -> Finding:
        """This part of the check could not run; ``reason`` says why (never silent)."""
        return Finding(Status.SKIP, reason, file, field)

    def note(self, message: str, *, file: str | None = None) -> Finding:
        """What a passing check looked at (e.g. "checked 8 ELF files")."""
        return Finding(Status.PASS, message, file)

    @staticmethod
    def _finding(
        status: Status, message: str, file: str | None, field: str | None, expected: Any, found: Any
    ) -> Finding:
        exp = None if expected is None else show(expected)
        fnd = None if found is None else show(found)
        if exp is not None or fnd is not None:
            message = f"{message} (expected {exp if exp is not None else '-'}, found {fnd if fnd is not None else '-'})"
        return Finding(status, message, file, field, exp, fnd)


class PackageRule(Rule):
    """Base of the rules that read the typed manifest: they run only once MAN001 built the Package."""

    needs: ClassVar[frozenset[Need]] = frozenset({Need.ROOT, Need.MANIFEST})
