"""Nothing a package contains reaches the terminal raw (calctl.textsafe and the CLI's SafeConsole).

A package's names, versions, file names and the messages that quote them go
through one path to rich: markup escaped, control characters and surrogates
shown escaped. The hostile strings here are the issue's (``[/x]`` crashed
``inspect`` and ``verify`` with MarkupError, an OSC 52 version wrote the
clipboard, ``"1.0\\ud800"`` crashed tables with UnicodeEncodeError), then
hypothesis feeds random markup, controls and surrogates into every manifest
string field and a file name and runs inspect, verify, validate and budget.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calctl import textsafe
from calctl.package.model import MANIFEST
from calctl.signing import keys, seal
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli
from tests.unit.validate.validate_factory import copy_package, edit_manifest, read_manifest, reseal

#: A raw control byte (C0 but TAB/LF, DEL, C1) or a surrogate: never on stdout or stderr.
pytestmark = pytest.mark.slow  # every hostile string through every command: its file is scheduled first

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
OSC52 = "\x1b]52;c;aGVsbG8=\x07"
COMMANDS = ("inspect", "verify", "validate", "budget")


def run_all(cli: Any, root: Path) -> dict[str, Any]:
    out = {}
    for command in COMMANDS:
        r = cli(command, root, "--trusted-key", TEST_PUB)
        text = r.out + r.err
        assert "internal error" not in text and "Traceback" not in text, (command, text[-2000:])
        assert r.code in (0, 1), (command, r.code, text[-2000:])
        assert not RAW.search(r.out), (command, RAW.search(r.out), r.out[-2000:])
        assert not RAW.search(r.err), (command, r.err[-2000:])
        out[command] = r
    return out


def test_plain_and_markup_escape_what_would_act_on_a_terminal() -> None:
    assert textsafe.plain("a\x1b[2Kb") == "a\\x1b[2Kb"
    assert textsafe.plain(OSC52) == "\\x1b]52;c;aGVsbG8=\\x07"
    assert textsafe.plain("1.0\ud800") == "1.0\\ud800"
    assert textsafe.plain("bad\udcff") == "bad\\xff"  # an undecodable file-name byte (surrogateescape)
    assert textsafe.plain("x\u202eexe.txt") == "x\\u202eexe.txt"
    assert textsafe.plain("a\nb\tc") == "a\\x0ab\\x09c"
    assert textsafe.plain("a\nb\tc", multiline=True) == "a\nb\tc"
    assert textsafe.plain("héllo 模型 [x]") == "héllo 模型 [x]"
    assert textsafe.markup("[/x]") == "\\[/x]"
    assert textsafe.markup("[link=file:///etc]y") == "\\[link=file:///etc]y"
    textsafe.plain("\ud800\udfff").encode("utf-8")  # always encodable


def test_the_consoles_never_write_a_raw_control_or_crash_on_markup() -> None:
    from rich.text import Text

    from calctl.cli._output import SafeConsole

    buf = io.StringIO()
    console = SafeConsole(file=buf, width=100, highlight=False)
    console.print(f"version [/x] {OSC52} 1.0\ud800")  # markup that does not parse: printed as text
    console.print(Text(f"raw Text {OSC52}\x1b[2K"))  # a Text bypasses markup: the last guard escapes it
    console.print("[bold]fine[/]")
    text = buf.getvalue()
    assert not RAW.search(text), text
    assert "[/x]" in text and "\\x1b]52" in text and "\\ud800" in text and "\\x1b[2K" in text
    assert "fine" in text and "[bold]" not in text


def test_markup_in_a_version_and_a_file_name_are_shown_not_parsed(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: d["package"].update(version="[/x][link=http://e]y"))
    (root / "model-a" / "[").mkdir()
    (root / "model-a" / "[" / "x]").write_bytes(b"unlisted")
    reseal(root)
    (root / "model-a" / "[" / "x] 2").write_bytes(b"unlisted after sealing")
    r = run_all(cli, root)
    assert r["inspect"].code == 0 and "[/x][link=http://e]y" in r["inspect"].out
    assert r["verify"].code == 1 and "model-a/[/x] 2" in r["verify"].out
    assert r["validate"].code == 1 and "model-a/[/x] 2" in r["validate"].out
    assert r["budget"].code == 1


@pytest.mark.parametrize("bad", [f"1.0{OSC52}\x1b[2K", "1.0\u202e", "1.0\x00", "1.0\x9b"])
def test_the_schema_refuses_control_characters_in_a_version(tmp_path: Path, cli: Cli, bad: str) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: d["package"].update(version=bad))
    reseal(root)
    r = run_all(cli, root)
    assert r["validate"].code == 1 and "MAN001" in r["validate"].out
    assert "control, bidirectional or surrogate characters" in " ".join(r["validate"].out.split())
    assert r["inspect"].code == 1 and "/package/version" in r["inspect"].err


def test_a_lone_surrogate_in_a_version_is_refused_not_a_crash(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    text = (root / MANIFEST).read_text().replace("version: 1.0.0", 'version: "1.0\\ud800"')
    assert "ud800" in text
    (root / MANIFEST).write_text(text)
    reseal(root, reserved_info=False)
    r = run_all(cli, root)
    codes = {c: r[c].code for c in COMMANDS}
    assert codes == {"inspect": 1, "verify": 0, "validate": 1, "budget": 1}, codes  # verify reads no manifest


def test_a_non_utf8_file_name_with_controls_is_printed_escaped(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    with open(os.path.join(os.fsencode(root), b"model-a", b"bad\xff\x1b[2K\x9b"), "wb") as fh:
        fh.write(b"x")
    r = run_all(cli, root)
    assert "bad\\xff\\x1b[2K\\x9b" in r["validate"].out


# ---------------------------------------------------------------------------
# hypothesis: every manifest string field and a file name

_FIELDS: list[tuple[str, ...]] = [
    ("package", "name"),
    ("package", "version"),
    ("package", "description"),
    ("models", "0", "alias"),
    ("models", "0", "name"),
    ("models", "0", "architecture", "family"),
    ("models", "0", "tokenizer", "file"),
    ("models", "0", "golden", "prompt", "file"),
    ("models", "1", "graphs", "0", "name"),
    ("models", "1", "graphs", "0", "sections", "0", "name"),
    ("models", "1", "graphs", "0", "sections", "0", "file"),
    ("memory_plan", "chips", "0", "regions", "0", "name"),
    ("memory_plan", "chips", "0", "regions", "0", "owner"),
]

_pieces = st.sampled_from(
    [
        "[/x]",
        "[bold]",
        "[/]",
        "[link=http://e]",
        "]",
        "[",
        "\\",
        ":smile:",
        "%s",
        "{0}",
        "$x$",
        "\x1b[2K",
        OSC52,
        "\x1b",
        "\r",
        "\n",
        "\t",
        "\x00",
        "\x7f",
        "\x85",
        "\x9b",
        "\u202e",
        "\u2028",
        "\ufeff",
        "\u200b",
        "\ud800",
        "\udfff",
        "\udcff",
        "模型",
        "é",
        "model-a",
        "1.0.0",
        " ",
    ]
)
hostile = st.lists(_pieces | st.text(max_size=3), min_size=1, max_size=6).map("".join)

BASE = FIXTURE_PACKAGES / "combined"
PRIVATE = keys.load_private(TEST_KEY)


def _set(doc: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    node: Any = doc
    for key in path[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[path[-1]] = value


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(field=st.sampled_from(_FIELDS), value=hostile, name=hostile)
def test_hostile_strings_in_every_field_get_a_verdict_never_a_raw_byte(cli: Cli, field, value: str, name: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="calctl-hyp-"))
    try:
        root = tmp / "pkg"
        shutil.copytree(BASE, root)
        doc = read_manifest(root)
        _set(doc, field, value)
        # JSON is YAML: \uXXXX escapes carry controls and lone surrogates into the manifest as they are.
        (root / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
        with contextlib.suppress(Exception):  # a value the factory cannot seal is still fed to the commands
            reseal(root)
        # Any code point, lone surrogates as their (invalid UTF-8) bytes: what a hostile tar or file system holds.
        raw = name.encode("utf-8", "surrogatepass").replace(b"/", b"_").replace(b"\0", b"_")[:200] or b"_"
        if raw not in (b".", b".."):
            with contextlib.suppress(OSError):
                (Path(os.fsdecode(os.path.join(os.fsencode(root), b"model-a", raw)))).write_bytes(b"x")
        run_all(cli, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_seal_is_unchanged_for_a_clean_copy(tmp_path: Path, cli: Cli) -> None:
    """The terminal guards change nothing for a clean package: all four commands exit 0."""
    root = copy_package(tmp_path)
    seal.seal(root, PRIVATE)
    r = run_all(cli, root)
    assert all(r[c].code == 0 for c in COMMANDS), {c: (r[c].code, r[c].err[-300:]) for c in COMMANDS}
