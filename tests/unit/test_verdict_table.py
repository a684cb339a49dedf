"""One verdict vocabulary, one table (#48 item 2): the terminal's colour, the page's colour and the exit code of
every verdict word come from ``calctl.report.VERDICTS``; these tests fail when two renderers disagree."""

from __future__ import annotations

import ast
import enum
import importlib
import re
from pathlib import Path
from typing import TypeGuard

import pytest

import calctl
from calctl import html_report
from calctl.cli import _output
from calctl.report import VERDICTS, Report, Tone, tone_of

#: The colour a person sees, by renderer: the terminal's rich colour name and the page's CSS class.
_TERMINAL = {"green": Tone.GOOD, "yellow": Tone.WARN, "red": Tone.BAD}
_PAGE = {"good": Tone.GOOD, "warn": Tone.WARN, "bad": Tone.BAD, "muted": Tone.NEUTRAL}


def _terminal_tone(word: str) -> Tone:
    styled = _output.styled_verdict(word)
    match = re.match(r"\[([^\]]*)\]", styled)
    colours = [c for c in (match.group(1).split() if match else []) if c in _TERMINAL]
    return _TERMINAL[colours[0]] if colours else Tone.NEUTRAL


def _page_tone(word: str, tmp_path: Path) -> Tone:
    html = html_report.render({"command": "x", "verdict": word}, tmp_path)
    match = re.search(r'<span class="verdict big ([a-z]+)" id="verdict">', html)
    assert match, html[:500]
    return _PAGE[match.group(1)]


@pytest.mark.parametrize("word", sorted(VERDICTS))
def test_the_terminal_and_the_page_give_every_word_the_tables_tone(word: str, tmp_path: Path) -> None:
    assert _terminal_tone(word) == VERDICTS[word].tone, f"terminal: {_output.styled_verdict(word)}"
    assert _page_tone(word, tmp_path) == VERDICTS[word].tone


@pytest.mark.parametrize("word", sorted(w for w, v in VERDICTS.items() if v.code is not None))
def test_a_reports_json_exit_code_is_the_tables(word: str) -> None:
    doc = Report("x", word).document()
    assert doc["verdict"] == word and doc["exit_code"] == int(VERDICTS[word].code or 0)


def test_a_failure_is_never_green_and_not_measured_is_never_green() -> None:
    for word, entry in VERDICTS.items():
        if entry.code is not None and entry.code != 0:
            assert entry.tone is Tone.BAD, word  # TIMEOUT, INTERNAL ERROR and F0 were grey on the page
    assert VERDICTS["NOT MEASURED"].tone is Tone.NEUTRAL and VERDICTS["SKIP"].tone is Tone.NEUTRAL


def test_a_headline_is_toned_by_its_first_word() -> None:
    assert tone_of("GO on 5 of 11 rows, 6 NOT MEASURED") is Tone.GOOD
    assert tone_of("NO-GO: G1") is Tone.BAD and tone_of("INTERNAL ERROR in soak") is Tone.BAD
    assert tone_of("yes") is Tone.NEUTRAL and tone_of(None) is Tone.NEUTRAL


def test_no_other_module_keeps_a_verdict_colour_table() -> None:
    """A second table would drift again: no module but _output names a rich colour beside a verdict word."""
    root = Path(calctl.__file__).parent
    words = "|".join(re.escape(w) for w in VERDICTS)
    pattern = re.compile(rf'"(?:{words})"\s*:\s*"(?:bold )?(?:green|yellow|red|magenta|good|warn|bad|muted)"')
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


# ---------------------------------------------------------------------------
# Every place a word is coloured: the page's row and step cells, the fleet page, the pictures.


def _cell_tones(html: str, marker: str) -> list[str]:
    return re.findall(rf'<td class="verdict ([a-z]+)">{marker}</td>', html)


@pytest.mark.parametrize("word", sorted(VERDICTS))
def test_the_pages_rows_steps_and_the_fleet_page_give_the_tables_tone(word: str, tmp_path: Path) -> None:
    from calctl.fleet import page as fleet_page

    doc = {
        "command": "x",
        "verdict": "PASS",
        "rows": [{"id": "G9", "verdict": word}],
        "steps": [{"name": "s", "status": word, "seconds": 1.0}],
    }
    cells = _cell_tones(html_report.render(doc, tmp_path), re.escape(word))
    assert [_PAGE[c] for c in cells] == [VERDICTS[word].tone] * 2, cells
    fleet = fleet_page.render(
        {
            "verdict": word,
            "step_names": ["s"],
            "boards": [{"board_id": "b0", "verdict": word, "steps": {"s": word}}],
        }
    )
    banner = re.search(r'<span class="verdict big ([a-z]+)" id="verdict">', fleet)
    board = re.search(r'<td><span class="verdict ([a-z]+)">', fleet)
    cell = re.search(rf'<td><span class="([a-z]+)">{re.escape(word)}</span></td>', fleet)
    assert banner and board and cell, fleet[-2000:]
    assert {_PAGE[banner.group(1)], _PAGE[board.group(1)], _PAGE[cell.group(1)]} == {VERDICTS[word].tone}


def test_the_pictures_use_the_pages_colour_for_each_tone() -> None:
    from calctl.runners.bench import plot

    root = Path(calctl.__file__).parent / "_data" / "html"
    for template in ("report.html.j2", "fleet.html.j2"):
        css = dict(re.findall(r"--(good|warn|bad|muted): (#[0-9a-f]{6})", (root / template).read_text()))
        assert {_PAGE[k]: v for k, v in css.items()} == plot.VERDICT_COLOURS, template


# ---------------------------------------------------------------------------
# A word the code prints without an entry here fails (#48 item 2: "when a word appears in output code").

#: The enums whose values are verdict words (a run's, a step's, a row's or a check's), by dotted path.
VERDICT_ENUMS = (
    "calctl.report.StepStatus",
    "calctl.runners.steps.RunOutcome",
    "calctl.runners.acceptance.rows.GateDecision",
    "calctl.runners.selftest.RowStatus",
    "calctl.runtime.conformance.framework.Verdict",
    "calctl.budget.policy.BudgetVerdict",
    "calctl.package.rules.base.Status",  # printed upper-case by validate
)
#: Upper-case enums that are not verdicts (a manifest field's values).
NOT_VERDICT_ENUMS = {"ChipMode"}

_SOURCES = sorted(Path(calctl.__file__).parent.rglob("*.py"))


def _enum(dotted: str) -> type[enum.Enum]:
    module, _, name = dotted.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    assert isinstance(found, type) and issubclass(found, enum.Enum), dotted
    return found


@pytest.mark.parametrize("dotted", VERDICT_ENUMS)
def test_every_value_of_a_verdict_enum_has_an_entry(dotted: str) -> None:
    missing = [m.value for m in _enum(dotted) if str(m.value).upper() not in VERDICTS]
    assert missing == [], f"{dotted}: {missing} not in calctl.report.VERDICTS"


def test_every_upper_case_enum_is_known_as_verdict_or_not() -> None:
    """A new enum of upper-case words (a new row status) is either listed above, and so checked, or named as not
    a verdict: it cannot slip past the table."""
    listed = {d.rpartition(".")[2] for d in VERDICT_ENUMS} | NOT_VERDICT_ENUMS
    found = []
    for path in _SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
                values = [
                    s.value.value
                    for s in node.body
                    if isinstance(s, ast.Assign)
                    and isinstance(s.value, ast.Constant)
                    and isinstance(s.value.value, str)
                ]
                if values and all(v == v.upper() for v in values) and node.name not in listed:
                    found.append(f"{path.name}:{node.name}")
    assert found == []


#: The grades of 001 §1 (C0-C4), §1 (S1/S2) and §13.4 (F0-F2): one letter and a digit.
_GRADE = re.compile(r"[CSF][0-9]")
_VERDICT_NAMES = re.compile(r"verdict|status|grade|outcome|decision", re.IGNORECASE)


def _is_word(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(re.fullmatch(r"[A-Z][A-Z0-9]*(?:[ -][A-Z0-9]+)*", value))


def _printed_words(tree: ast.AST) -> list[tuple[int, str]]:
    """Upper-case words the code gives a verdict: ``styled_verdict("X")``, ``verdict="X"``, ``{"status": "X"}``,
    ``verdict = "X"``, ``grade == "X"``, and a grade (``"C0"``) anywhere."""
    out: list[tuple[int, str]] = []

    def take(node: ast.AST | None) -> None:
        """The word constants ``node`` may evaluate to: itself, a branch, an element; not a call's arguments."""
        if isinstance(node, ast.Constant) and _is_word(node.value):
            out.append((node.lineno, node.value))
        elif isinstance(node, (ast.IfExp, ast.BoolOp, ast.Tuple, ast.List, ast.Set)):
            for child in ast.iter_child_nodes(node):
                take(child)

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _GRADE.fullmatch(node.value):
            out.append((node.lineno, node.value))  # a grade, wherever it is written (a vendor answer's C0)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("styled_verdict"):
            take(node.args[0] if node.args else None)
        elif isinstance(node, ast.keyword) and node.arg and _VERDICT_NAMES.search(node.arg):
            take(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and _VERDICT_NAMES.search(key.value):
                    take(value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_VERDICT_NAMES.search(ast.unparse(t)) for t in targets) and not isinstance(node.value, ast.Dict):
                take(node.value)
        elif isinstance(node, ast.Compare) and _VERDICT_NAMES.search(ast.unparse(node.left)):
            for c in node.comparators:
                take(c)
    return out


def test_every_word_the_code_gives_a_verdict_has_an_entry() -> None:
    missing = [
        f"{path.relative_to(path.parents[1])}:{line}: {word}"
        for path in _SOURCES
        for line, word in _printed_words(ast.parse(path.read_text(encoding="utf-8")))
        if word not in VERDICTS
    ]
    assert missing == []


def test_the_scan_finds_a_word_without_an_entry() -> None:
    code = 'styled_verdict("PASS"); f(verdict="SORTA"); d = {"status": "MEH"}; grade = "C9"; ok = verdict == "OK-ISH"'
    code += '; answer = Answer("q", "C5", "yes")'
    found = {w for _, w in _printed_words(ast.parse(code))} - set(VERDICTS)
    assert found == {"SORTA", "MEH", "C9", "OK-ISH", "C5"}


#: Console markup that colours a verdict by hand: ``[bold red]NO-GO[/]``, ``[bold red]{report.verdict}[/]``.
_HAND_COLOURED = re.compile(
    r"\[(?:bold )?(?:red|green|yellow|magenta)\](?:[A-Z][A-Z0-9]*(?:[ -][A-Z0-9]+)*|\{[^}]*(?:verdict|status|grade)[^}]*\})\[/"
)


def test_no_module_colours_a_verdict_word_by_hand() -> None:
    """The terminal colours a verdict through ``_output.styled_verdict`` only: markup written beside the word
    drifted from the table (S1 red on one screen, yellow on another)."""
    offenders = [
        f"{p.name}:{n}"
        for p in _SOURCES
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if _HAND_COLOURED.search(line)
    ]
    assert offenders == []


# ---------------------------------------------------------------------------
# docs/cli.md "Verdicts" says the same: every word in its table, every word under its tone's colour.

_CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _documented_words() -> set[str]:
    section = _CLI_MD.read_text(encoding="utf-8").split("## Verdicts", 1)[1].split("\n### ", 1)[0]
    cells = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    return {w.strip() for cell in cells[2:] for w in cell.split(" / ")}


def _documented_tones() -> dict[str, Tone]:
    text = " ".join(_CLI_MD.read_text(encoding="utf-8").split())
    bullet = text.split("A verdict word has one colour everywhere", 1)[1].split("* ", 1)[0]
    colours = {"green": Tone.GOOD, "yellow": Tone.WARN, "red": Tone.BAD, "none": Tone.NEUTRAL}
    out: dict[str, Tone] = {}
    for colour, words in re.findall(r"\b(green|yellow|red|none) for [^(]*\(([^)]*)\)", bullet):
        for word in words.split(":")[0].split(","):
            out[word.strip()] = colours[colour]
    return out


def test_docs_cli_md_lists_every_word_of_the_table() -> None:
    assert set(VERDICTS) <= _documented_words(), sorted(set(VERDICTS) - _documented_words())


def test_docs_cli_md_gives_every_word_the_tables_colour() -> None:
    assert _documented_tones() == {w: v.tone for w, v in VERDICTS.items()}


def test_junit_outcomes_follow_the_tables_exit_codes() -> None:
    """One rule for every JUnit writer: exit 1 a failure, another non-zero code an error, not run skipped."""
    outcomes = {w: _output.junit_outcome(w) for w in VERDICTS}
    assert {w for w, o in outcomes.items() if o == "failure"} == {"FAIL", "NO-GO", "F0"}
    assert {w for w, o in outcomes.items() if o == "error"} == {"ERROR", "TIMEOUT", "INTERRUPTED", "INTERNAL ERROR"}
    assert {w for w, o in outcomes.items() if o == "skipped"} == {"SKIP", "UNSUPPORTED"}
