"""Validation commands: ``validate``, ``rules``, ``explain``.

Thin bodies: parse options into a :class:`ValidationPolicy`, call
:func:`calctl.package.validate.validate`, render the report as a table, JSON
(``validate-report/v1``) or JUnit XML. Exit codes: 0 accepted (warnings
allowed), 1 rejected, 2 usage or environment error. No rule logic lives here.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from calctl.cli import _output
from calctl.cli._options import AllowUnsignedOpt, FormatOpt, JobsOpt, ResultFormatOpt, TrustedKeyOpt, int_option
from calctl.cli._output import Format, TableJson
from calctl.cli._package_arg import PackageArg, resolve_package
from calctl.errors import UsageError
from calctl.report import Report, build_header, simple_report
from calctl.textsafe import markup as safe

#: Entries of one rule the table prints (a package can cause thousands; the table printed ~1.5 ms a row);
#: the rest are counted ("... and N more"), and JSON/JUnit hold every one.
MAX_SHOWN_PER_RULE = 20

if TYPE_CHECKING:  # the rules and jsonschema load when a command runs, not for its --help (issue 31)
    from calctl.package.rules import Rule
    from calctl.package.validate import RuleFinding, ValidationReport


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
        int_option(
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
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Table: list every rule's result, passes included.")
    ] = False,
    format: ResultFormatOpt = Format.table,
) -> int:
    """Statically validate a package before it touches a board.

    Checks layout, manifest, hashes, signature, chip masks, ELF, memory plan, tensors, tokenizer and
    compatibility. The table shows failures, errors, warnings and skips in full and counts the passes
    (--verbose lists every rule); JSON and JUnit always hold every rule's result.
    Exit 0 = accepted (warnings allowed), 1 = rejected, 2 = usage or environment error.
    """
    from calctl.package.rules.compat import parse_version
    from calctl.package.validate import ValidationPolicy
    from calctl.package.validate import validate as run_validation

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
    result = Report("validate", report.verdict, build_header("validate"), report.to_dict())
    if format is Format.json:
        _output.emit_json(result)
    elif format is Format.junit:
        _output.emit_junit("calctl validate", junit_suites(report))
    else:
        _print_report(report, verbose=verbose)
    return result.exit_code


def _print_report(report: ValidationReport, *, verbose: bool = False) -> None:
    """Failures, errors, warnings and skips in full (one finding per block); passes counted (``--verbose``: listed)."""
    from calctl.package.rules import Status

    out = _output.stdout
    shown = [c for c in report.checks if verbose or c.status is not Status.PASS]
    out.print(f"[bold]calctl validate[/] {safe(report.package)}", soft_wrap=False)  # a long path wraps at 80
    per_rule: dict[str, int] = {}
    for c in report.checks:
        if verbose or c.status is not Status.PASS:
            per_rule[c.id] = per_rule.get(c.id, 0) + 1
    printed: dict[str, int] = {}
    for c in shown:
        printed[c.id] = printed.get(c.id, 0) + 1
        if printed[c.id] > MAX_SHOWN_PER_RULE:
            if printed[c.id] == MAX_SHOWN_PER_RULE + 1:
                more = per_rule[c.id] - MAX_SHOWN_PER_RULE
                out.print(f"  [dim]... and {more:,} more {c.id} entries (--format json lists all of them)[/]")
            continue
        where = ": ".join(safe(p) for p in (c.file, c.field) if p)
        out.print(
            f"  {_output.styled_verdict(c.status.value.upper())} {c.id} [dim]{c.group.value}[/]"
            + (f" {where}" if where else "")
        )
        out.print(Padding(Text(c.message), (0, 0, 0, 6)), soft_wrap=False)
    passed = sorted({c.id for c in report.checks if c.status is Status.PASS} - set(report.failed_ids()))
    if not verbose:
        out.print(f"  [dim]{len(passed)} rule(s) passed (--verbose lists them; --format json has every result)[/]")
    n_rules = len(report.rule_ids())
    failed = report.failed_ids()
    warned = [c.id for c in report.warnings]
    skipped = list(dict.fromkeys(c.id for c in report.skipped))
    counts = (
        (f"failed {', '.join(failed)}; " if failed else "")
        + f"{n_rules} rules: {len(passed)} passed, {len(failed)} failing"
        + f", {_output.warning_summary(warned)}, {len(skipped)} skipped"
        + (f" ({', '.join(skipped)})" if skipped else "")
    )
    if report.digest:
        out.print(f"digest sha256:{report.digest}", soft_wrap=False)
        out.print(f"signer: {report.signer_key_id or 'not verified'}")
    verdict = report.verdict
    why = ""
    if not report.ok and not failed:
        why = "; rejected by --fail-on-warn/--fail-on-skip"
    out.print(f"verdict {_output.styled_verdict(verdict)}: {counts}{why}")


# ---------------------------------------------------------------------------
# JUnit XML: one testsuite per group, one testcase per rule.


def junit_suites(report: ValidationReport) -> list[_output.JunitSuite]:
    """The report as JUnit suites: failures = fail (and warn/skip when the policy rejects them)."""
    from calctl.package.rules import Status, rule_by_id

    by_rule: dict[str, list[RuleFinding]] = {}
    for c in report.checks:
        by_rule.setdefault(c.id, []).append(c)
    rejecting = {Status.FAIL}
    if report.fail_on_warn:
        rejecting.add(Status.WARN)
    if report.fail_on_skip:
        rejecting.add(Status.SKIP)
    cases: dict[str, list[_output.JunitCase]] = {}
    for rule_id, entries in by_rule.items():
        group = entries[0].group.value
        rule = rule_by_id(rule_id)
        summary = rule.summary() if rule else rule_id
        statuses = {c.status for c in entries}
        lines = "\n".join(_line(c) for c in entries)
        outcome, message, kind = None, "", ""
        if Status.ERROR in statuses:
            crashed = next(c for c in entries if c.status is Status.ERROR)
            outcome, message, kind = "error", crashed.message, "error"
        elif statuses & rejecting:
            bad = next(c for c in entries if c.status in rejecting)
            outcome, message, kind = "failure", bad.message, bad.status.value
        elif statuses == {Status.SKIP}:
            outcome, message = "skipped", entries[0].message
        cases.setdefault(group, []).append(
            _output.JunitCase(
                name=f"{rule_id} {summary}",
                classname=f"calctl.validate.{group}",
                outcome=outcome,
                message=message,
                kind=kind,
                text=lines,
                output=lines,
                warning="; ".join(
                    f"{c.file}: {c.message}" if c.file else c.message for c in entries if c.status is Status.WARN
                )
                if outcome is None
                else "",
            )
        )
    props = [("package", report.package)] + ([("digest", report.digest)] if report.digest else [])
    return [_output.JunitSuite(f"calctl.validate.{g}", cs, props) for g, cs in cases.items()]


def junit_xml(report: ValidationReport) -> str:
    return _output.junit_xml("calctl validate", junit_suites(report))


def _line(c: RuleFinding) -> str:
    where = ": ".join(p for p in (c.file, c.field) if p)
    return f"{c.status.value.upper()} {c.id} {where + ': ' if where else ''}{c.message}"


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


def rules(format: FormatOpt = TableJson.table) -> None:
    """List every validation rule: ID, group, severity, summary."""
    from calctl.package.rules import RULES

    if _output.is_json(format):
        _output.emit_json(simple_report("rules", {"rules": [_rule_doc(r) for r in RULES]}))
        return
    _output.print_table(
        f"{len(RULES)} validation rules (calctl explain ID for details)",
        ["id", "group", "severity", "summary"],
        [[r.id, r.group.value, r.severity.value, escape(r.summary())] for r in RULES],
    )


def explain(
    rule_id: Annotated[str, typer.Argument(metavar="ID", help="Rule ID, e.g. CHIP003 (see `calctl rules`).")],
    format: FormatOpt = TableJson.table,
) -> None:
    """Explain one validation rule: what it checks, why, and where from.

    Prints the rule's explanation and the report sections it enforces (001 = the dual-model report,
    000 = the scheduling report; a docs/ path names this project's own documentation).
    """
    from calctl.package.rules import rule_by_id

    rule = rule_by_id(rule_id)
    if rule is None:
        raise UsageError(f"unknown rule ID {rule_id!r}", hint=_did_you_mean(rule_id))
    doc = _rule_doc(rule)
    if _output.is_json(format):
        _output.emit_json(simple_report("explain", doc))
        return
    _output.stdout.print(f"[bold]{rule.id}[/] ({rule.group.value}, {rule.severity.value}): {escape(rule.summary())}")
    _output.stdout.print(escape(rule.explanation))
    _output.stdout.print(f"[dim]enforces:[/] {escape(', '.join(rule.sections))}")
    needs = [n.value for n in sorted(rule.needs, key=lambda n: n.value) if n.value != "root"]
    if needs:
        _output.stdout.print(f"[dim]skips (with the reason) when unavailable:[/] {', '.join(needs)}")


def _did_you_mean(rule_id: str) -> str:
    from calctl.package.rules import RULES

    ids = [r.id for r in RULES]
    close = difflib.get_close_matches(rule_id.upper(), ids, n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(close)}? (`calctl rules` lists every ID)"
    return "run `calctl rules` for the list of IDs"


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("rules")(rules)
    app.command("explain")(explain)


__all__ = ["junit_xml", "register"]
