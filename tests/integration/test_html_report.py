"""report.html: one self-contained page per run, opened in headless Chromium (Debian's `chromium`).

The page is rendered from the run's JSON document; these tests open it as a
reader would: it renders with no console error, every picture decodes, the
verdict text equals the JSON's, and nothing is fetched from anywhere.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from calctl import html_report
from tests.conftest import Cli, CliResult

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")

#: Appended to a probe copy of the page (whose CSP is removed for it): reports every <img> that did not decode.
_PROBE = """<script>
window.addEventListener('load', () => {
  const bad = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({images: document.images.length, broken: bad});
  document.body.appendChild(out);
});
</script>"""


def _chromium(page: Path, tmp: Path, *, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.search(r"CONSOLE|Uncaught|Refused to|ERR_", line)]


def _open(page: Path, tmp: Path) -> dict[str, object]:
    """The page's DOM as Chromium rendered it, its console errors, and the probe's picture count."""
    shown = _chromium(page, tmp, extra=("--dump-dom",))
    assert shown.returncode == 0, shown.stderr[-2000:]
    probe_page = page.with_name("probe-" + page.name)
    html = page.read_text(encoding="utf-8")
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    probe_page.write_text(html.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    probed = _chromium(probe_page, tmp, extra=("--dump-dom",))
    match = re.search(r'<pre id="probe">(.*?)</pre>', probed.stdout, re.S)
    assert match, probed.stderr[-2000:]
    probe_page.unlink()
    return {
        "dom": shown.stdout,
        "errors": _console_errors(shown.stderr),
        "probe": json.loads(match.group(1).replace("&quot;", '"')),
    }


def _verdict_in(dom: str) -> str:
    match = re.search(r'<span class="verdict big [a-z]+" id="verdict">(.*?)</span>', dom)
    assert match, dom[:2000]
    return match.group(1)


@pytest.fixture(scope="module")
def bringup_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    from calctl.cli.app import main

    out = tmp_path_factory.mktemp("html") / "bringup"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["bringup", "--level", "quick", "--report", str(out)])
    result = CliResult(code, stdout.getvalue(), stderr.getvalue())
    assert result.code == 0, result.err
    return out, result


def test_bringup_writes_report_html_beside_report_json_and_names_it(bringup_dir: tuple[Path, CliResult]) -> None:
    out, result = bringup_dir
    page = out / "report.html"
    assert page.is_file()
    assert "report.html" in result.out
    doc = json.loads((out / "report.json").read_text())
    html = page.read_text(encoding="utf-8")
    assert f'id="verdict">{doc["verdict"]}</span>' in html
    assert "MOCK RESULT" in html and 'id="device-label">mock<' in html
    for step in doc["summary"]:
        assert f"<strong>{step['step']}</strong>" in html
    # Self-contained: every picture is embedded, nothing is loaded from elsewhere.
    assert "<script" not in html
    assert not re.search(r'src="(?!data:)', html)
    pngs = sorted(out.rglob("*.png"))
    assert pngs and html.count('src="data:image/png;base64,') == len(pngs)


@needs_chromium
def test_the_bringup_page_renders_in_chromium(bringup_dir: tuple[Path, CliResult], tmp_path: Path) -> None:
    out, _ = bringup_dir
    doc = json.loads((out / "report.json").read_text())
    seen = _open(out / "report.html", tmp_path)
    assert seen["errors"] == []
    assert _verdict_in(str(seen["dom"])) == doc["verdict"]
    probe = seen["probe"]
    assert isinstance(probe, dict) and probe["broken"] == [] and probe["images"] >= 3


@needs_chromium
def test_a_broken_picture_is_seen_by_the_chromium_check(bringup_dir: tuple[Path, CliResult], tmp_path: Path) -> None:
    """The check can fail: a page whose picture is not a PNG shows up as a broken image."""
    out, _ = bringup_dir
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    victim = sorted(copy.rglob("*.png"))[0]
    victim.write_bytes(b"not a png")
    doc = json.loads((copy / "report.json").read_text().replace(str(out), str(copy)))  # the copy's own files
    html_report.write(doc, copy / "report.json")
    probe = _open(copy / "report.html", tmp_path)["probe"]
    assert isinstance(probe, dict) and len(probe["broken"]) == 1


def test_hostile_strings_reach_the_page_escaped(tmp_path: Path) -> None:
    doc = {
        "command": "run-golden",
        "verdict": "FAIL",
        "exit_code": 1,
        "device": "mock",
        "mock_result": True,
        "package": {"name": "<script>alert(1)</script>", "version": "1.0\x1b]52;c;aGk=\x07\ud800"},
        "summary": [{"step": "<b>x</b>", "verdict": "FAIL", "key_figure": "[/x] \x1b[2K", "detail": "", "files": {}}],
    }
    page = html_report.write(doc, tmp_path / "report.json")
    html = page.read_text(encoding="utf-8")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "\x1b" not in html and "\\x1b" in html and "\\ud800" in html
    assert "FAIL" in html and "<b>x</b>" not in html


def test_rows_that_are_not_good_are_the_reasons(tmp_path: Path) -> None:
    doc = {
        "command": "accept",
        "verdict": "NO-GO",
        "exit_code": 1,
        "device": "calrt",
        "runtime": {"firmware": "reference (software model, no hardware)"},
        "rows": [
            {"id": "G0", "title": "capacity", "verdict": "GO", "key_figure": "fits", "files": {}},
            {"id": "G1", "title": "golden", "verdict": "NO-GO", "key_figure": "1/2 chips", "reason": "model-b differs"},
            {"id": "G2", "title": "isolation", "verdict": "NOT MEASURED", "reason": "the host was too slow"},
        ],
        "steps": [{"name": "run-golden", "status": "FAIL", "seconds": 1.0, "detail": "", "key_figure": "1/2"}],
    }
    html = html_report.render(doc, tmp_path)
    reasons = re.search(r'<ul class="reasons" id="reasons">(.*?)</ul>', html, re.S)
    assert reasons
    assert "G1 NO-GO: model-b differs" in reasons.group(1) and "G2 NOT MEASURED" in reasons.group(1)
    assert "G0" not in reasons.group(1)
    assert 'id="device-label">software model<' in html
    assert 'id="steps"' in html and "1/2" in html


def test_the_failing_step_that_is_the_error_is_said_once(tmp_path: Path) -> None:
    """A pipeline's ``error`` is its first failing step's ``<step>: <detail>``: the page's reasons say it once,
    not again as that step's row (the conformance FAIL of a broken library was listed twice)."""
    why = "kv_busy_in_flight (KV-3): calrt_kv_free of sequence 1 while job 1 in flight writes it must return 1"
    doc = {
        "command": "bringup",
        "verdict": "FAIL",
        "exit_code": 1,
        "device": "calrt",
        "error": f"conformance: {why}",
        "summary": [
            {"step": "conformance", "verdict": "FAIL", "key_figure": "38/39", "seconds": 1.0, "detail": why},
            {"step": "validate", "verdict": "WARN", "key_figure": "", "seconds": 1.0, "detail": "SIG002"},
        ],
    }
    reasons = re.search(r'<ul class="reasons" id="reasons">(.*?)</ul>', html_report.render(doc, tmp_path), re.S)
    assert reasons
    items = [i.strip() for i in re.findall(r"<li>(.*?)</li>", reasons.group(1), re.S)]
    assert items == [f"conformance: {why}", "validate WARN: SIG002"], items


def test_an_interrupted_run_says_the_signal_first_among_its_reasons(tmp_path: Path) -> None:
    """A signal after the last step (the teardown) leaves every row good: the page still says why the run is
    INTERRUPTED, from the report's ``error``."""
    doc = {
        "command": "bringup",
        "verdict": "INTERRUPTED",
        "exit_code": 130,
        "device": "mock",
        "error": "interrupted (SIGTERM) after soak, the last step",
        "summary": [
            {"step": "validate", "verdict": "PASS", "key_figure": "", "seconds": 1.0, "detail": "", "files": {}},
            {"step": "soak", "verdict": "WARN", "key_figure": "", "seconds": 1.0, "detail": "a warning", "files": {}},
        ],
    }
    reasons = re.search(r'<ul class="reasons" id="reasons">(.*?)</ul>', html_report.render(doc, tmp_path), re.S)
    assert reasons
    items = re.findall(r"<li>(.*?)</li>", reasons.group(1), re.S)
    assert items[0].strip() == "interrupted (SIGTERM) after soak, the last step", items
    assert any("soak WARN: a warning" in i for i in items[1:]), items


def test_run_golden_and_soak_write_their_page_beside_their_json(cli: Cli, tmp_path: Path) -> None:
    golden = tmp_path / "golden.json"
    r = cli("run-golden", "--report", str(golden))
    assert r.code == 0, r.err
    doc = json.loads(golden.read_text())
    assert f'id="verdict">{doc["verdict"]}</span>' in (tmp_path / "golden.html").read_text(encoding="utf-8")
    soak = tmp_path / "soak"
    r = cli("soak", "--cycles", "1", "--report", str(soak))
    assert r.code == 0, r.err
    doc = json.loads((soak / "soak-report.json").read_text())
    page = (soak / "soak-report.html").read_text(encoding="utf-8")
    assert f'id="verdict">{doc["verdict"]}</span>' in page and "data:image/png;base64," in page


def test_a_json_report_named_html_keeps_its_name(tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    target.write_text("{}")
    page = html_report.write({"command": "x", "verdict": "PASS"}, target)
    assert page != target and target.read_text() == "{}" and page.is_file()


def test_every_bringup_warn_says_why_and_pictures_name_their_command(bringup_dir: tuple[Path, CliResult]) -> None:
    out, _ = bringup_dir
    doc = json.loads((out / "report.json").read_text())
    warned = [s for s in doc["summary"] if s["verdict"] == "WARN"]
    assert warned and all(s["detail"] for s in warned), warned  # run-golden's WARN had an empty detail


def test_accept_titles_its_pictures_accept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from calctl.runners import bringup, trace

    titles: list[str] = []
    real = trace.write_trace_outputs

    def spy(*a, **k):
        titles.append(k["title"])
        return real(*a, **k)

    monkeypatch.setattr(trace, "write_trace_outputs", spy)  # the driver's picture writer calls it
    from calctl.compiler.bundled import bundled_package
    from calctl.runners.device import DeviceSpec
    from calctl.signing.policy import make_policy

    cfg = bringup.BringupConfig(
        package=bundled_package("combined"),
        trust=make_policy(None, trust_test_key=True),
        device=DeviceSpec(),
        level=bringup.Level.QUICK,
        out_dir=tmp_path,
        command="accept",
    )
    import contextlib

    with contextlib.ExitStack() as stack:
        bringup._golden(bringup.BringupState(config=cfg, stack=stack))
    assert titles == ["calctl accept: run-golden"]


def test_fields_of_any_type_render(tmp_path: Path) -> None:
    """A document's fields are what its command made them (bench's `seconds` is a mapping): the page never
    assumes a type, it shows what it can."""
    odd: list[object] = [None, {"a": 1}, [1, 2], "x", 1.5, True, float("nan")]
    for value in odd:
        doc = {
            "command": value,
            "verdict": value,
            "exit_code": value,
            "seconds": value,
            "summary": value,
            "package": value,
            "runtime": value,
            "rows": [{"id": value, "verdict": value, "seconds": value, "evidence": value, "files": value}],
            "steps": [{"name": value, "status": value, "seconds": value}],
            "files": value,
            "facts": [value, [value, value], value],
            "pictures": value,
            "trace": value,
            "error": value,
        }
        assert "<html" in html_report.render(doc, tmp_path)


def test_bidi_and_zero_width_characters_are_escaped_on_the_page(tmp_path: Path) -> None:
    doc = {"command": "run-golden", "verdict": "PASS", "package": {"path": "P\u202ex\u2028y\u200bz\u2066w\x9b"}}
    html = html_report.render(doc, tmp_path)
    for raw in ("\u202e", "\u2028", "\u200b", "\u2066", "\x9b"):
        assert raw not in html
    assert "\\u202e" in html and "\\u2028" in html


def _embedded(html: str) -> int:
    return html.count('src="data:image/png;base64,')


def test_a_page_embeds_only_the_pictures_its_report_lists(bringup_dir: tuple[Path, CliResult], tmp_path: Path) -> None:
    """#53 item 1: a PNG that merely lies under the report's folder (another run's, a planted holiday photo) is
    not this run's evidence; the page embeds exactly the PNGs report.json names."""
    out, _ = bringup_dir
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    listed = {
        Path(f).name for s in json.loads((copy / "report.json").read_text())["summary"] for f in s["files"].values()
    }
    listed_pngs = {n for n in listed if n.endswith(".png")}
    holiday = copy / "photos" / "holiday.png"
    holiday.parent.mkdir()
    shutil.copy(sorted(copy.rglob("*.png"))[0], holiday)
    shutil.copy(holiday, copy / "another-run.png")
    doc = json.loads((copy / "report.json").read_text())
    html = html_report.write(doc, copy / "report.json").read_text(encoding="utf-8")
    assert "holiday.png" not in html and "another-run.png" not in html
    assert listed_pngs and _embedded(html) == len(listed_pngs)


def test_run_golden_in_a_folder_with_photos_embeds_none_of_them(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's repro: ``mkdir -p x/photos && cp any.png x/photos/holiday.png && cd x && calctl run-golden
    --report golden.json``; the page names its own plot when one was asked for, and nothing else."""
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "holiday.png").write_bytes(_tiny_png())
    monkeypatch.chdir(tmp_path)
    r = cli("run-golden", "--report", "golden.json")
    assert r.code == 0, r.err
    page = tmp_path / "golden.html"
    assert str(page) in r.out or "golden.html" in r.out  # #53 item 10: the page's path is printed
    assert _embedded(page.read_text(encoding="utf-8")) == 0
    r = cli("run-golden", "--report", "golden.json", "--plot", "golden.png")
    assert r.code == 0, r.err
    html = page.read_text(encoding="utf-8")
    assert _embedded(html) == 1 and "holiday" not in html and "golden.png" in html


def _tiny_png() -> bytes:
    import base64

    return base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )


def test_a_go_beside_rows_not_measured_is_not_a_green_headline(tmp_path: Path) -> None:
    """#53 item 3: the accept page was a big green GO while 6 of 11 rows were NOT MEASURED."""
    doc = {
        "command": "accept",
        "verdict": "GO",
        "exit_code": 0,
        "device": "mock",
        "rows": [
            {"id": "G0", "title": "capacity", "verdict": "GO", "key_figure": "fits"},
            {"id": "G1", "title": "golden", "verdict": "GO", "key_figure": "2/2"},
            {
                "id": "M3",
                "title": "batch",
                "verdict": "NOT MEASURED",
                "reason": "model-a compiles decode profiles B1",
                "how_to_measure": "`calctl bench PKG --scenario batch`",
            },
        ],
    }
    html = html_report.render(doc, tmp_path)
    assert 'class="verdict big muted" id="verdict">GO</span>' in html
    assert 'id="headline">on 2 of 3 rows, 1 NOT MEASURED</span>' in html
    assert 'class="banner banner-muted"' in html  # a neutral border, and the reasons in the text's colour
    reasons = re.search(r'<ul class="reasons" id="reasons">(.*?)</ul>', html, re.S)
    assert reasons and "To measure: `calctl bench PKG --scenario batch`" in reasons.group(1)
    assert re.search(r'<td class="verdict good">GO</td>', html)  # the GO rows stay green
    assert re.search(r'<td class="verdict muted">NOT MEASURED</td>', html)
    rows = doc["rows"]
    assert isinstance(rows, list)
    every_row_go = {**doc, "rows": rows[:2]}
    assert 'class="verdict big good" id="verdict">GO</span>' in html_report.render(every_row_go, tmp_path)


def test_the_mock_page_claims_nothing_for_the_run_and_hides_no_internals(
    bringup_dir: tuple[Path, CliResult],
) -> None:
    """#53 item 7: "It shows that the tool and the package work end to end" was printed for refused packages too,
    and the mock's page said ``software_model True``."""
    out, result = bringup_dir
    html = (out / "report.html").read_text(encoding="utf-8")
    device = re.search(r'<p id="device">(.*?)</p>', html, re.S)
    assert device and "software_model" not in device.group(1)
    for text in (html, result.out):
        assert "work end to end" not in text and "MOCK RESULT" in text
