"""One verdict vocabulary, one table (#48 item 2): the terminal's colour, the page's colour and the exit code of
every verdict word come from ``calctl.report.VERDICTS``; these tests fail when two renderers disagree."""

from __future__ import annotations

import re
from pathlib import Path

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
