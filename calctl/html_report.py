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

#: Pictures larger than this are linked, not embedded (a page stays mailable).
MAX_EMBEDDED_PICTURE = 8 * 2**20
#: The raw JSON shown at the end of the page is cut to this many characters.
MAX_RAW_JSON = 400_000


#: Verdict words (docs/cli.md "Verdicts") -> the page's colour class.
_TONE = {
    "GO": "good",
    "PASS": "good",
    "S2": "good",
    "OK": "good",
    "WARN": "warn",
    "NOT MEASURED": "muted",
    "NOT JUDGED": "muted",
    "SKIP": "muted",
    "NO-GO": "bad",
    "FAIL": "bad",
    "S1": "bad",
    "ERROR": "bad",
    "FAILED": "bad",
    "INTERRUPTED": "bad",
    "HUNG": "bad",
}


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
    word = str(verdict or "").upper()
    for key, cls in _TONE.items():
        if word == key or word.startswith(key + " ") or word.startswith(key + ":"):
            return cls
    return "muted"


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
        "runtime": ", ".join(f"{k} {v}" for k, v in runtime.items() if v is not None),
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
    candidates = [path, report_dir / path, report_dir.parent / path]
    for p in candidates:
        try:
            return Path(os.path.relpath(p.resolve(), report_dir.resolve())).as_posix()
        except (OSError, ValueError):
            continue
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
    given = doc.get("reasons")
    if isinstance(given, list) and given:
        return [visible(r) for r in given]
    out = []
    if doc.get("verdict") == "INTERRUPTED" and doc.get("error"):  # the signal, and where: no row may say it
        out.append(visible(str(doc["error"])))
    for r in rows:
        if tone(r["verdict"]) != "good":
            why = r["detail"] or r["key_figure"]
            out.append(f"{r['name']} {r['verdict']}" + (f": {why}" if why else ""))
    return out


def _pictures(doc: Mapping[str, Any], report_dir: Path, rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Every PNG of the run: those a row names first (captioned with the row), then the rest of the directory."""
    seen: dict[Path, str] = {}
    for r in rows:
        for label, href in r["files"]:
            if href.lower().endswith(".png"):
                seen.setdefault((report_dir / href).resolve(), f"{r['name']} {r['title']}".strip() + f" ({label})")
    files = doc.get("files")
    for label, href in _files(files, report_dir):
        if href.lower().endswith(".png"):
            seen.setdefault((report_dir / href).resolve(), str(label))
    if report_dir.is_dir():
        for p in sorted(report_dir.rglob("*.png")):
            seen.setdefault(p.resolve(), p.relative_to(report_dir).as_posix())
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
    """Everything the template shows, taken from the document (and the PNGs beside it)."""
    rows = _rows(doc, report_dir)
    raw = dumps(dict(doc), indent=1)  # what report.json holds (records.dumps: the one JSON writer)
    if len(raw) > MAX_RAW_JSON:
        raw = raw[:MAX_RAW_JSON] + f"\n… cut at {MAX_RAW_JSON:,} characters: report.json has the whole document"
    summary = doc.get("summary")
    return {
        "command": visible(doc.get("command") or ""),
        "level": visible(doc.get("level") or ""),
        "verdict": _verdict(doc),
        "tone": tone(_verdict(doc)),
        "summary": visible(summary) if isinstance(summary, str) else "",
        "exit_code": doc.get("exit_code") if isinstance(doc.get("exit_code"), int) else None,
        "started_at": visible(doc.get("started_at") or ""),
        "seconds": _number(doc.get("seconds")),
        "calctl_version": visible(doc.get("calctl_version") or ""),
        "device": {k: visible(v) for k, v in _device(doc).items()},
        "package": [(k, visible(v)) for k, v in _package(doc)],
        "reasons": _reasons(doc, rows),
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

    path = json_path.with_suffix(".html")
    if path == json_path:  # a JSON report named *.html keeps its name; the page goes beside it
        path = json_path.with_name(json_path.name + ".page.html")
    write_atomic(path, render(doc, json_path.parent))
    return path
