"""Static acceptance of a calbin package: ``validate(package, policy) -> ValidationReport``.

This is the one validator every command calls before a package touches a board
(001 §16 PR1 "bad mask/hash/shape rejected before start-up", §6.4 "exit before
configure"): ``calctl validate`` renders its report; the runners and the server
call :func:`validate` first and refuse the package unless the report is truthy::

    from calctl.package.validate import ValidationPolicy, validate
    from calctl.signing.policy import make_policy

    report = validate(Path("pkg.tar"), ValidationPolicy(trust=make_policy([Path("release.pub")]),
                                                        expect_models=("model-a", "model-b")))
    if not report:
        for check in report.errors:
            print(check.id, check.file, check.field, check.message)

Every registered rule (:data:`calctl.package.rules.RULES`) appears in every
report at least once, as pass, fail, warn, skip (with the reason) or error (the
rule crashed on input it did not expect; the exception text is the message).

This module does not print, does not pick exit codes and does not touch a
device. It raises only :class:`calctl.errors.UsageError` (the path does not
exist); everything wrong *inside* a package is a finding.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl import textsafe
from calctl.errors import PackageFormatError, UsageError
from calctl.package import archive
from calctl.package.reader import package_root
from calctl.package.rules import RULES
from calctl.package.rules.base import Finding, Group, Rule, Severity, Status
from calctl.package.rules.context import ReadProblem, ValidationContext, crash_types, printable
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS
from calctl.signing.policy import TrustPolicy

REPORT_SCHEMA = "validate-report/v1"


@dataclass(frozen=True)
class SizeLimits:
    """Ceilings the layout rules enforce (LAY005); defaults match safe tar extraction."""

    max_file_bytes: int = archive.MAX_MEMBER_BYTES
    max_total_bytes: int = archive.MAX_TOTAL_BYTES
    max_files: int = archive.MAX_MEMBERS


@dataclass(frozen=True)
class ValidationPolicy:
    """What the caller requires of a package beyond its own consistency.

    * ``trust`` – trusted keys and ``allow_unsigned`` (SIG001 warns instead of failing);
    * ``expect_models`` – the exact alias set (MAN004), None = whatever the package has;
    * ``profiles`` – batch profiles the caller will use; each must exist (MAN005, 000 §15);
    * ``runtime_version`` – must lie in compatibility.json's runtime range (COMP002);
    * ``jobs`` – hashing threads (None = cores);
    * ``fail_on_warn`` / ``fail_on_skip`` – make warnings / skips reject the package;
    * ``limits`` – size ceilings (LAY005).
    """

    trust: TrustPolicy = field(default_factory=TrustPolicy)
    expect_models: tuple[str, ...] | None = None
    profiles: tuple[int, ...] = ()
    runtime_version: str | None = None
    jobs: int | None = None
    fail_on_warn: bool = False
    fail_on_skip: bool = False
    limits: SizeLimits = field(default_factory=SizeLimits)


@dataclass(frozen=True, kw_only=True)
class RuleFinding(Finding):
    """One report entry: a rule's verdict on one file/field (or on the whole package): its finding, made
    printable, with the rule's ID, group and severity."""

    id: str
    group: Group
    severity: Severity

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group.value,
            "severity": self.severity.value,
            "status": self.status.value,
            "file": self.file,
            "field": self.field,
            "message": self.message,
            "expected": self.expected,
            "found": self.found,
        }


def _refusal_line(c: RuleFinding) -> str:
    where = (c.file or "") + (f":{c.field}" if c.field else "")
    return f"{c.id} {where}: {c.message}" if where else f"{c.id}: {c.message}"


@dataclass(frozen=True)
class ValidationReport:
    """The outcome of :func:`validate`. Truthy only when the package is accepted."""

    package: str
    checks: tuple[RuleFinding, ...]
    fail_on_warn: bool = False
    fail_on_skip: bool = False
    digest: str | None = None  # sha256 of checksums.sha256: commits to every file
    signer_key_id: str | None = None

    @property
    def errors(self) -> tuple[RuleFinding, ...]:
        """Entries that reject the package: ``fail`` and ``error``."""
        return tuple(c for c in self.checks if c.status in (Status.FAIL, Status.ERROR))

    @property
    def warnings(self) -> tuple[RuleFinding, ...]:
        return tuple(c for c in self.checks if c.status is Status.WARN)

    @property
    def skipped(self) -> tuple[RuleFinding, ...]:
        return tuple(c for c in self.checks if c.status is Status.SKIP)

    @property
    def ok(self) -> bool:
        if self.errors:
            return False
        if self.fail_on_warn and self.warnings:
            return False
        return not (self.fail_on_skip and self.skipped)

    def __bool__(self) -> bool:
        return self.ok

    @property
    def verdict(self) -> str:
        """The one validate verdict (``calctl validate``, bringup's validate step): FAIL when the package is
        rejected, WARN when it is accepted with warnings, else PASS (docs/cli.md "Verdicts")."""
        if not self.ok:
            return "FAIL"
        return "WARN" if self.warnings else "PASS"

    def rule_ids(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for c in self.checks:
            seen.setdefault(c.id, None)
        return tuple(seen)

    def status_of(self, rule_id: str) -> Status:
        """The worst status among a rule's entries (error > fail > warn > skip > pass)."""
        found = [c.status for c in self.checks if c.id == rule_id]
        if not found:
            raise KeyError(rule_id)
        return max(found, key=lambda s: s.rank)

    def failed_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.id for c in self.errors))

    def refusal(self, limit: int = 4) -> str:
        """Why the package is refused, in one sentence every command prints the same way: each failing check as
        ``RULE file[:field]: message`` (the rule, the file and the figure; #53 item 6: ``(HASH001)`` alone named
        no file): ``limit`` findings, the first of every failing rule among them, and how many more each rule
        has."""
        errors = list(self.errors)
        if not errors:
            return "rejected by policy"
        # The first finding of every failing rule (not four of the first rule), then the rest in order up to limit.
        firsts = [i for i, c in enumerate(errors) if c.id not in {e.id for e in errors[:i]}]
        shown = sorted(
            firsts[: max(limit, 1)] + [i for i in range(len(errors)) if i not in firsts][: max(0, limit - len(firsts))]
        )
        hidden: dict[str, int] = {}
        for i, c in enumerate(errors):
            if i not in shown:
                hidden[c.id] = hidden.get(c.id, 0) + 1
        more = ", ".join(f"{n} more {rule}" for rule, n in hidden.items())
        return "; ".join(_refusal_line(errors[i]) for i in shown) + (f"; and {more}" if more else "")

    def to_dict(self) -> dict[str, Any]:
        """The ``validate-report/v1`` document (without ``schema_version``, added by the renderer)."""
        return {
            "package": self.package,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "skipped": len(self.skipped),
            "rules": len(self.rule_ids()),
            "digest": self.digest,
            "signer_key_id": self.signer_key_id,
            "checks": [c.to_dict() for c in self.checks],
        }


def run_rules(ctx: ValidationContext, rules: Sequence[type[Rule]] = RULES) -> tuple[RuleFinding, ...]:
    """Run every rule against ``ctx``; each contributes at least one entry, whatever happens."""
    out: list[RuleFinding] = []
    for cls in rules:
        rule = cls()
        findings = _findings(rule, ctx)
        problems = [f for f in findings if f.status is not Status.PASS]
        if not problems:
            notes = [f.message for f in findings]
            problems = [Finding(Status.PASS, "; ".join(notes) if notes else cls.summary())]
        for f in problems:
            out.append(
                RuleFinding(
                    f.status,
                    _text(f.message),
                    _clip(f.file),
                    _clip(f.field),
                    _opt(f.expected),
                    _opt(f.found),
                    id=cls.id,
                    group=cls.group,
                    severity=cls.severity,
                )
            )
    return tuple(out)


def _text(s: str) -> str:
    """Make any text printable and encodable: file names on disk may hold undecodable bytes.

    Undecodable bytes arrive as lone surrogates (os's surrogateescape); they are
    printed as ``\\xNN``, exactly as :func:`calctl.package.rules.context.shown` does.
    """
    return printable(s)


def _opt(s: str | None) -> str | None:
    return None if s is None else _text(s)


def _clip(s: str | None) -> str | None:
    """A file name or field: longer than any real one (a 60 KB name) is shown as its head and tail, and length."""
    return None if s is None else textsafe.clip(_text(s))


def _findings(rule: Rule, ctx: ValidationContext) -> list[Finding]:
    reason = ctx.unmet(rule.needs)
    if reason:
        return [rule.skip(f"{rule.group.label} check skipped: {reason}")]
    try:
        return list(rule.check(ctx))
    except crash_types() as exc:  # a rule bug on odd input: say so in the report, never a traceback
        text = str(exc) or type(exc).__name__
        return [Finding(Status.ERROR, f"the rule crashed and could not decide: {type(exc).__name__}: {text[:500]}")]


def validate(package: Path | str, policy: ValidationPolicy | None = None) -> ValidationReport:
    """Validate the package at ``package`` (a directory or a ``.tar``) under ``policy``.

    Raises :class:`UsageError` only when ``package`` does not exist. An archive that
    cannot be extracted safely is reported by LAY007, with every other rule skipped.
    """
    policy = policy or ValidationPolicy()
    path = Path(package)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory", hint="give a package directory or .tar")
    with contextlib.ExitStack() as stack:
        try:
            root: Path | None = stack.enter_context(package_root(path))
            archive_error = None
        except PackageFormatError as exc:
            root, archive_error = None, str(exc)
        ctx = ValidationContext(
            root, display=str(path), policy=policy, archive_error=archive_error, is_archive=not path.is_dir()
        )
        return _report(ctx, str(path))


def validate_root(
    root: Path, policy: ValidationPolicy | None = None, *, display: str | None = None
) -> ValidationReport:
    """Validate an already extracted package directory (what :func:`validate` does for a directory)."""
    ctx = ValidationContext(root, display=display or str(root), policy=policy or ValidationPolicy())
    return _report(ctx, display or str(root))


def _report(ctx: ValidationContext, display: str) -> ValidationReport:
    checks = run_rules(ctx)
    digest = signer = None
    if ctx.root is not None:
        with contextlib.suppress(ReadProblem):
            digest = hashlib.sha256(ctx.read_bytes(CHECKSUMS, seal.MAX_CHECKSUM_FILE)).hexdigest()
        # SIG001 already reported any failure of this fact (as fail, or error if it crashed).
        with contextlib.suppress(Exception):
            tk = ctx.signature.signer
            signer = tk.key_id if tk is not None else None
    return ValidationReport(
        package=display,
        checks=checks,
        fail_on_warn=ctx.policy.fail_on_warn,
        fail_on_skip=ctx.policy.fail_on_skip,
        digest=digest,
        signer_key_id=signer,
    )
