"""Validation commands: ``validate``, ``rules``, ``explain``.

Thin bodies: parse options into a :class:`ValidationPolicy`, call
:func:`calctl.package.validate.validate`, render the report as a table, JSON
(``validate-report/v1``) or JUnit XML. Exit codes: 0 accepted (warnings
allowed), 1 rejected, 2 usage or environment error. No rule logic lives here.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from typing import Annotated, Any

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._options import AllowUnsignedOpt, FormatOpt, TrustedKeyOpt
from calctl.cli._output import Format
from calctl.cli._package_arg import PackageArg, resolve_package
from calctl.errors import ExitCode, UsageError
from calctl.package.rules import RULES, Rule, Status, rule_by_id
from calctl.package.rules.compat import parse_version
from calctl.package.validate import CheckResult, Report, ValidationPolicy
from calctl.package.validate import validate as run_validation

JobsOpt = Annotated[int | None, typer.Option("--jobs", "-j", min=1, max=256, help="Hashing threads (default: cores).")]

_STATUS_LABEL = {
    Status.PASS: "PASS",
    Status.FAIL: "FAIL",
    Status.WARN: "WARN",
    Status.SKIP: "SKIP",
    Status.ERROR: "ERROR",
}


def _split_models(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(p.strip() for p in text.split(","))
    if not items or any(not p for p in items):
        raise UsageError(f"--expect-models {text!r}: expected comma-separated aliases such as model-a,model-b")
    if len(set(items)) != len(items):
        raise UsageError(f"--expect-models {text!r}: an alias is named twice")
    return items


def validate(
    pkg: PackageArg = None,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    expect_models: Annotated[
        str | None,
        typer.Option(
            "--expect-models", help="Exact comma-separated alias set the package must hold, e.g. model-a,model-b."
        ),
    ] = None,
    runtime_version: Annotated[
        str | None,
        typer.Option(
            "--runtime-version", help="CalRT version in use (e.g. 0.7.6); must be in compatibility.json's range."
        ),
    ] = None,
    profile: Annotated[
        list[int] | None,
        typer.Option(
            "--profile", min=1, help="Batch profile the deployment will use; repeatable. Each must be compiled in."
        ),
    ] = None,
    jobs: JobsOpt = None,
    fail_on_warn: Annotated[
        bool, typer.Option("--fail-on-warn", help="Reject the package when any check warns.")
    ] = False,
    fail_on_skip: Annotated[
        bool, typer.Option("--fail-on-skip", help="Reject the package when any check was skipped.")
    ] = False,
    format: FormatOpt = Format.table,
) -> int:
    """Statically validate a package: layout, manifest, hashes, signature, masks, ELF, memory, tensors, tokenizer, compatibility.

    Every rule appears in the report as pass, fail, warn, skip (with its reason) or error.
    Exit 0 = accepted (warnings allowed), 1 = rejected, 2 = usage or environment error.
    """
    if runtime_version is not None and parse_version(runtime_version) is None:
        raise UsageError(f"--runtime-version {runtime_version!r}: expected a dotted version such as 0.7.6")
    models = _split_models(expect_models)
    path, trust, _ = resolve_package(pkg, trusted_key, allow_unsigned)
    policy = ValidationPolicy(
        trust=trust,
        expect_models=models,
        profiles=tuple(sorted(set(profile or ()))),
        runtime_version=runtime_version,
        jobs=jobs,
        fail_on_warn=fail_on_warn,
        fail_on_skip=fail_on_skip,
    )
    report = run_validation(path, policy)
    if format is Format.json:
        _output.emit_json(report.to_dict())
    elif format is Format.junit:
        _emit_junit(report)
    else:
        _print_report(report)
    return int(ExitCode.OK if report.ok else ExitCode.FAILED)


def _print_report(report: Report) -> None:
    rows = []
    for c in report.checks:
        rows.append(
            [
                _output.styled_verdict(_STATUS_LABEL[c.status]),
                c.id,
                c.group.value,
                escape(c.file or ""),
                escape(c.field or ""),
                escape(c.message),
            ]
        )
    _output.stdout.print(
        _output.make_table(
            f"calctl validate {escape(report.package)}", ["status", "rule", "group", "file", "field", "message"], rows
        )
    )
    n_rules = len(report.rule_ids())
    failed = report.failed_ids()
    counts = (
        f"{n_rules} rules; {len(report.errors)} failing, {len(report.warnings)} warnings, {len(report.skipped)} skipped"
    )
    if report.digest:
        _output.stdout.print(f"digest sha256:{report.digest}  signer: {report.signer_key_id or 'not verified'}")
    if report.ok:
        _output.stdout.print(f"{_output.styled_verdict('PASS')} {escape(report.package)}: {counts}")
    else:
        why = f"failed {', '.join(failed)}" if failed else "rejected by --fail-on-warn/--fail-on-skip"
        _output.stdout.print(f"{_output.styled_verdict('FAIL')} {escape(report.package)}: {counts}; {why}")


# ---------------------------------------------------------------------------
# JUnit XML: one testsuite per group, one testcase per rule.

_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: str | None) -> str:
    return _XML_BAD.sub("\ufffd", text or "")


def junit_xml(report: Report) -> str:
    """The report as JUnit XML: failures = fail (and warn/skip when the policy rejects them)."""
    root = ET.Element("testsuites", name="calctl validate")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    by_rule: dict[str, list[CheckResult]] = {}
    for c in report.checks:
        by_rule.setdefault(c.id, []).append(c)
    suites: dict[str, ET.Element] = {}
    counts: dict[str, dict[str, int]] = {}
    for rule_id, entries in by_rule.items():
        first = entries[0]
        group = first.group.value
        if group not in suites:
            suites[group] = ET.SubElement(root, "testsuite", name=f"calctl.validate.{group}")
            props = ET.SubElement(suites[group], "properties")
            ET.SubElement(props, "property", name="package", value=_x(report.package))
            if report.digest:
                ET.SubElement(props, "property", name="digest", value=report.digest)
            counts[group] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        rule = rule_by_id(rule_id)
        summary = rule.summary() if rule else rule_id
        case = ET.SubElement(
            suites[group], "testcase", classname=f"calctl.validate.{group}", name=_x(f"{rule_id} {summary}")
        )
        counts[group]["tests"] += 1
        statuses = {c.status for c in entries}
        lines = "\n".join(_x(_line(c)) for c in entries)
        rejecting = {Status.FAIL}
        if report.fail_on_warn:
            rejecting.add(Status.WARN)
        if report.fail_on_skip:
            rejecting.add(Status.SKIP)
        if Status.ERROR in statuses:
            crashed = next(c for c in entries if c.status is Status.ERROR)
            el = ET.SubElement(case, "error", message=_x(crashed.message), type="error")
            el.text = lines
            counts[group]["errors"] += 1
        elif statuses & rejecting:
            bad = next(c for c in entries if c.status in rejecting)
            el = ET.SubElement(case, "failure", message=_x(bad.message), type=bad.status.value)
            el.text = lines
            counts[group]["failures"] += 1
        elif statuses == {Status.SKIP}:
            ET.SubElement(case, "skipped", message=_x(entries[0].message))
            counts[group]["skipped"] += 1
        out = ET.SubElement(case, "system-out")
        out.text = lines
    for group, el in suites.items():
        for k, v in counts[group].items():
            el.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _line(c: CheckResult) -> str:
    where = ": ".join(p for p in (c.file, c.field) if p)
    return f"{c.status.value.upper()} {c.id} {where + ': ' if where else ''}{c.message}"


def _emit_junit(report: Report) -> None:
    sys.stdout.write(junit_xml(report))
    sys.stdout.flush()


# ---------------------------------------------------------------------------
# rules / explain


def _rule_doc(rule: type[Rule]) -> dict[str, Any]:
    return {
        "id": rule.id,
        "group": rule.group.value,
        "severity": rule.severity.value,
        "summary": rule.summary(),
        "explanation": rule.explanation,
        "sections": list(rule.sections),
        "needs": sorted(n.value for n in rule.needs),
    }


def _table_or_json(format: Format) -> Format:
    if format is Format.junit:
        raise UsageError("--format junit applies to `calctl validate` only; use table or json")
    return format


def rules(format: FormatOpt = Format.table) -> None:
    """List every validation rule: stable ID, group, severity and one-line summary."""
    if _table_or_json(format) is Format.json:
        _output.emit_json({"rules": [_rule_doc(r) for r in RULES]})
        return
    _output.print_table(
        f"{len(RULES)} validation rules (calctl explain ID for details)",
        ["id", "group", "severity", "summary"],
        [[r.id, r.group.value, r.severity.value, escape(r.summary())] for r in RULES],
    )


def explain(
    rule_id: Annotated[str, typer.Argument(metavar="ID", help="Rule ID, e.g. CHIP003 (see `calctl rules`).")],
    format: FormatOpt = Format.table,
) -> None:
    """Explain one validation rule: what it checks, why, and the report section it enforces."""
    fmt = _table_or_json(format)
    rule = rule_by_id(rule_id)
    if rule is None:
        raise UsageError(f"unknown rule ID {rule_id!r}", hint="run `calctl rules` for the list of IDs")
    doc = _rule_doc(rule)
    if fmt is Format.json:
        _output.emit_json(doc)
        return
    _output.stdout.print(f"[bold]{rule.id}[/] ({rule.group.value}, {rule.severity.value}): {escape(rule.summary())}")
    _output.stdout.print(escape(rule.explanation))
    _output.stdout.print(f"[dim]enforces:[/] {escape(', '.join(rule.sections))}")
    needs = [n.value for n in sorted(rule.needs, key=lambda n: n.value) if n.value != "root"]
    if needs:
        _output.stdout.print(f"[dim]skips (with the reason) when unavailable:[/] {', '.join(needs)}")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("rules")(rules)
    app.command("explain")(explain)


__all__ = ["junit_xml", "register"]
