"""``report.html``: one self-contained page per run, rendered from the run's JSON document.

The page is the document a bring-up engineer hands to someone: the verdict and
its reasons first, then the device and what kind of device it is (mock,
software model or board), then every row or step with its key figure, evidence
and picture. It is rendered from the same document that is written as
``report.json`` (one source of truth), so the two cannot disagree: the verdict
text on the page is the JSON's ``verdict``. Pictures are embedded as data URIs
and the page loads nothing from anywhere (no script, no font, no stylesheet),
so it can be attached to a mail or opened from a CI artifact.

What this module does not do: decide anything. It lays out what the runner
decided; a field the document does not have is left out, never invented.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from calctl.records import dumps
from calctl.report import Tone, tone_of

#: Pictures larger than this are linked, not embedded (a page stays mailable).
MAX_EMBEDDED_PICTURE = 8 * 2**20
#: The raw JSON shown at the end of the page is cut to this many characters.
MAX_RAW_JSON = 400_000


def visible(value: object) -> str:
    """A string from a package or a device as text a page can hold: control characters and unpaired
    surrogates shown escaped (``\\x1b``, ``\\ud800``), never passed through."""
    from calctl.textsafe import plain  # the terminal's escaping: controls, bidi, zero-width, surrogates

    return plain(value, multiline=True)


def _number(value: object) -> float | None:
    """A duration the page can print: a real number, else nothing (a document's field may be anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def tone(verdict: object) -> str:
    """The page's colour class of a verdict word: its tone in calctl.report.VERDICTS, the table the terminal reads
    too (``neutral`` is the page's ``muted``)."""
    return {Tone.NEUTRAL: "muted"}.get(tone_of(verdict), tone_of(verdict).value)


def _device(doc: Mapping[str, Any]) -> dict[str, str]:
    """What ran the checks, and what kind of thing it is: the label every result carries."""
    runtime: Mapping[str, Any] = doc["runtime"] if isinstance(doc.get("runtime"), Mapping) else {}
    header: Mapping[str, Any] = doc["header"] if isinstance(doc.get("header"), Mapping) else {}
    device = str(doc.get("device") or header.get("device") or "")
    label = doc.get("device_label") or header.get("device_label")
    if not label:
        if doc.get("mock_result") or device == "mock":
            label = "mock"
        elif doc.get("software_model") or "software model" in str(runtime.get("firmware", "")):
            label = "software model"
        elif device:
            label = "board"
    return {
        "device": device,
        "label": str(label or "unknown"),
        "note": str(doc.get("note") or header.get("note") or ""),
        # software_model is what the label says in words; ``software_model True`` beside a mock misled (#53 item 7)
        "runtime": ", ".join(f"{k} {v}" for k, v in runtime.items() if v is not None and k != "software_model"),
    }


def _package(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    pkg = doc.get("package")
    if isinstance(pkg, Mapping):
        keys = ("name", "version", "kind", "path", "digest", "signer_key_id")
        return [(k, str(pkg[k])) for k in keys if pkg.get(k) not in (None, "")]
    return [("path", str(pkg))] if pkg else []


def _files(files: object, report_dir: Path) -> list[tuple[str, str]]:
    """(label, href) of a row's evidence files, relative to the report directory where they are inside it."""
    out: list[tuple[str, str]] = []
    items: Iterable[tuple[str, Any]]
    if isinstance(files, Mapping):
        items = files.items()
    elif isinstance(files, Sequence) and not isinstance(files, str):
        items = ((Path(str(f)).name, f) for f in files)
    else:
        return out
    for label, value in items:
        for path in value if isinstance(value, list) else [value]:
            if path in (None, ""):
                continue
            out.append((str(label), _href(Path(str(path)), report_dir)))
    return out


def _href(path: Path, report_dir: Path) -> str:
    """``path`` relative to the report directory. A relative path in a document is relative to the report's
    directory (its parent for a step's own report), never to wherever the page happens to be rendered from:
    the first of those that exists is the file meant."""
    candidates = [path] if path.is_absolute() else [report_dir / path, report_dir.parent / path, path]
    existing = [p for p in candidates if p.exists()] or candidates[:1]
    try:
        return Path(os.path.relpath(existing[0].resolve(), report_dir.resolve())).as_posix()
    except (OSError, ValueError):
        return path.as_posix()


def _rows(doc: Mapping[str, Any], report_dir: Path) -> list[dict[str, Any]]:
    """The verdict's rows: accept's G/M rows, or a pipeline's step summary, or a bench's gates."""
    raw: list[Any] = next((doc[k] for k in ("rows", "summary", "gates") if isinstance(doc.get(k), list)), [])
    rows = []
    for r in raw:
        if not isinstance(r, Mapping):
            continue
        name = r.get("id") or r.get("step") or r.get("name") or r.get("gate") or ""
        title = r.get("title") or ""
        evidence = r.get("evidence")
        rows.append(
            {
                "name": visible(name),
                "title": visible(title),
                "verdict": visible(r.get("verdict") or r.get("status") or ""),
                "key_figure": visible(r.get("key_figure") or r.get("value") or ""),
                "detail": visible(r.get("reason") or r.get("detail") or r.get("rule") or r.get("condition") or ""),
                "how": visible(r.get("how_to_measure") or ""),
                "action": visible(r.get("action") or ""),
                "evidence": [visible(e) for e in evidence] if isinstance(evidence, list) else [],
                "files": [(visible(a), b) for a, b in _files(r.get("files"), report_dir)],
                "seconds": _number(r.get("seconds")),
            }
        )
    return rows


def _steps(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = doc.get("steps")
    if not isinstance(raw, list):
        return []
    out = []
    for s in raw:
        if isinstance(s, Mapping):
            out.append(
                {
                    "name": visible(s.get("name") or s.get("step") or ""),
                    "status": visible(s.get("status") or s.get("verdict") or ""),
                    "seconds": _number(s.get("seconds")),
                    "key_figure": visible(s.get("key_figure") or ""),
                    "detail": visible(s.get("detail") or ""),
                }
            )
    return out


def _reasons(doc: Mapping[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Why the verdict is what it is: the document's own reasons, else every row that is not plainly good."""
    out = []
    # The error first, whatever the verdict: the signal and where, a deleted ELF behind a soak's FAIL (#53 item 2)
    if doc.get("error") and tone_of(doc.get("verdict")) is not Tone.GOOD:
        out.append(visible(str(doc["error"])))
    given = doc.get("reasons")
    if isinstance(given, list) and given:
        return out + [visible(r) for r in given if visible(r) not in out]
    for r in rows:
        if tone(r["verdict"]) != "good":
            why = r["detail"] or r["key_figure"]
            if why and visible(f"{r['name']}: {why}") in out:  # the error is this step's reason: said once
                continue
            line = f"{r['name']} {r['verdict']}" + (f": {why}" if why else "")
            if r["how"]:  # a row not measured says what would measure it (#53 item 3)
                line += f". To measure: {r['how']}"
            if r["action"]:
                line += f". Action: {r['action']}"
            out.append(line)
    return out


def _facts(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what, result) lines the runner says about its run (a soak's requests, errors, memory): shown under the
    verdict, before the evidence."""
    raw = doc.get("facts")
    if not isinstance(raw, list):
        return []
    return [(visible(f[0]), visible(f[1])) for f in raw if isinstance(f, (list, tuple)) and len(f) == 2]


def _headline(verdict: str, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """(the words after the verdict, the banner's tone). A verdict whose rows are not all as good as it is never
    says more than they do: ``GO`` + ``on 5 of 11 rows, 6 NOT MEASURED``, in the tone of the weakest row
    (a NOT MEASURED row is neutral, so the banner is not green) (#53 item 3)."""
    own = tone(verdict)
    if own != "good" or not rows:
        return "", own
    others: dict[str, int] = {}
    for r in rows:
        if tone(r["verdict"]) != "good":
            others[r["verdict"]] = others.get(r["verdict"], 0) + 1
    if not others:
        return "", own
    good = len(rows) - sum(others.values())
    rest = f"on {good} of {len(rows)} rows, " + ", ".join(f"{n} {word}" for word, n in others.items())
    tones = {tone(w) for w in others}
    return rest, next((t for t in ("bad", "warn") if t in tones), "muted")


def _listed_pictures(doc: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(caption, path) of the PNGs the document itself names outside its rows: ``pictures``, ``files`` and a
    runner's ``trace`` files (run-golden, warmup, poc)."""
    out: list[tuple[str, Any]] = []
    for key in ("pictures", "files", "trace"):
        value = doc.get(key)
        if isinstance(value, Mapping):
            out.extend((str(label), path) for label, path in value.items())
        elif isinstance(value, Sequence) and not isinstance(value, str):
            out.extend((Path(str(path)).name, path) for path in value)
    return out


def _pictures(doc: Mapping[str, Any], report_dir: Path, rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The PNGs this run wrote, as its document lists them: those a row names first (captioned with the row),
    then the document's own. Nothing else: a PNG that merely lies in the folder (another run's, a planted
    ``photos/holiday.png``) is not this run's evidence (#53 item 1)."""
    seen: dict[Path, str] = {}
    for r in rows:
        for label, href in r["files"]:
            if href.lower().endswith(".png"):
                seen.setdefault((report_dir / href).resolve(), f"{r['name']} {r['title']}".strip() + f" ({label})")
    for label, path in _listed_pictures(doc):
        for href in (h for _, h in _files({label: path}, report_dir)):
            if href.lower().endswith(".png"):
                seen.setdefault((report_dir / href).resolve(), label)
    pictures = []
    for path, caption in seen.items():
        if not path.is_file():
            continue
        href = _href(path, report_dir)
        size = path.stat().st_size
        src = href
        if size <= MAX_EMBEDDED_PICTURE:
            src = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
        pictures.append({"caption": visible(caption), "href": href, "src": src})
    return pictures


def _verdict(doc: Mapping[str, Any]) -> str:
    return visible(doc.get("verdict") or doc.get("status") or "")


def context(doc: Mapping[str, Any], report_dir: Path) -> dict[str, Any]:
    """Everything the template shows, taken from the document (and the PNGs it names)."""
    rows = _rows(doc, report_dir)
    raw = dumps(dict(doc), indent=1)  # what report.json holds (records.dumps: the one JSON writer)
    if len(raw) > MAX_RAW_JSON:
        raw = raw[:MAX_RAW_JSON] + f"\n… cut at {MAX_RAW_JSON:,} characters: report.json has the whole document"
    summary = doc.get("summary")
    headline, banner = _headline(_verdict(doc), rows)
    return {
        "command": visible(doc.get("command") or ""),
        "level": visible(doc.get("level") or ""),
        "verdict": _verdict(doc),
        "tone": tone(_verdict(doc)),
        "headline": headline,
        "banner_tone": banner,
        "summary": visible(summary) if isinstance(summary, str) else "",
        "exit_code": doc.get("exit_code") if isinstance(doc.get("exit_code"), int) else None,
        "started_at": visible(doc.get("started_at") or ""),
        "seconds": _number(doc.get("seconds")),
        "calctl_version": visible(doc.get("calctl_version") or ""),
        "device": {k: visible(v) for k, v in _device(doc).items()},
        "package": [(k, visible(v)) for k, v in _package(doc)],
        "reasons": _reasons(doc, rows),
        "facts": _facts(doc),
        "rows": rows,
        "steps": _steps(doc) if isinstance(doc.get("rows"), list) else [],
        "pictures": _pictures(doc, report_dir, rows),
        "raw_json": raw,
        "tone_of": tone,
    }


def render(doc: Mapping[str, Any], report_dir: Path) -> str:
    """The page for ``doc``, whose relative file paths are relative to ``report_dir``."""
    from importlib import resources

    from jinja2 import Environment, StrictUndefined, select_autoescape

    env = Environment(autoescape=select_autoescape(default=True), undefined=StrictUndefined, trim_blocks=True)
    template = env.from_string(resources.files("calctl").joinpath("_data", "html", "report.html.j2").read_text())
    return template.render(**context(doc, report_dir))


def write(doc: Mapping[str, Any], json_path: Path) -> Path:
    """Write the page beside the run's JSON document (``report.json`` -> ``report.html``) atomically."""
    from calctl.records import write_atomic

    path = page_path(json_path)
    write_atomic(path, render(doc, json_path.parent))
    return path


def page_path(json_path: Path) -> Path:
    """Where :func:`write` puts the page of ``json_path`` (``report.json`` -> ``report.html``), for a command
    that prints it."""
    path = json_path.with_suffix(".html")
    if path == json_path:  # a JSON report named *.html keeps its name; the page goes beside it
        path = json_path.with_name(json_path.name + ".page.html")
    return path
