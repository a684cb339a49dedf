"""``fleet-report.html``: the fleet's page, rendered from the ``fleet-report.json`` document.

The page rules of ``report.html`` (calctl.html_report): the verdict and its reasons first, every failing
board before the others, each verdict in the tone the verdict table gives it, nothing loaded from anywhere
(no script, font or stylesheet). A row links to that board's own report directory and page, relatively, so
the fleet directory can be moved or archived whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calctl.html_report import tone, visible


def context(doc: Mapping[str, Any]) -> dict[str, Any]:
    steps = [visible(s) for s in doc.get("step_names") or []]
    boards = []
    for b in doc.get("boards") or []:
        own = b.get("steps") or {}
        identity = [
            (k, visible(b[k]))
            for k in ("device", "device_label", "library", "selector", "seed", "fault_plan", "place")
            if b.get(k) not in (None, "")
        ]
        boards.append(
            {
                "id": visible(b.get("board_id") or ""),
                "verdict": visible(b.get("verdict") or ""),
                "infrastructure": bool(b.get("infrastructure")),
                "reason": visible(b.get("reason") or ""),
                "identity": identity,
                "package": visible(b.get("package") or ""),
                "digest": visible(b.get("package_digest") or ""),
                "cells": [visible(own.get(s, "")) for s in doc.get("step_names") or []],
                "link": b.get("report_dir"),
                "page": b.get("page"),
            }
        )
    counts = doc.get("counts") or {}
    return {
        "verdict": visible(doc.get("verdict") or ""),
        "exit_code": doc.get("exit_code"),
        "command": visible(doc.get("command") or ""),
        "started_at": visible(doc.get("started_at") or ""),
        "calctl_version": visible(doc.get("calctl_version") or ""),
        "reasons": [visible(r) for r in doc.get("reasons") or []],
        "note": visible(doc.get("note") or ""),
        "counts": ", ".join(f"{n} {visible(w)}" for w, n in counts.items()),
        "digests": [visible(d) for d in doc.get("package_digests") or []],
        "steps": steps,
        "boards": boards,
        "tone_of": tone,
    }


def render(doc: Mapping[str, Any]) -> str:
    from importlib import resources

    from jinja2 import Environment, StrictUndefined, select_autoescape

    env = Environment(autoescape=select_autoescape(default=True), undefined=StrictUndefined, trim_blocks=True)
    template = env.from_string(resources.files("calctl").joinpath("_data", "html", "fleet.html.j2").read_text())
    return template.render(**context(doc))
