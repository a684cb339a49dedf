"""At 80 columns (a pty of that width), tables wrap between words: no identifier is split across lines."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_PUB

GRAPHS = ("model_a_prefill", "model_a_decode", "model_b_prefill", "model_b_decode")


def _in_pty(*args: str, columns: int = 80) -> str:
    """Run calctl on a pseudo-terminal ``columns`` wide; return what it showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "dumb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "calctl", *args], stdin=follower, stdout=follower, stderr=subprocess.DEVNULL, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "│" in line or "┃" in line]


@pytest.mark.parametrize(
    ("args", "identifiers"),
    [
        (("inspect", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB)), GRAPHS),
        (
            ("budget", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB)),
            ("code_and_commands", "allocator_fragmentation", "runtime_metadata", "workspace_peak", "M_required"),
        ),
        (("warmup", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB)), GRAPHS),
    ],
    ids=["inspect", "budget", "warmup"],
)
def test_tables_at_80_columns_keep_identifiers_whole(args: tuple[str, ...], identifiers: tuple[str, ...]) -> None:
    text = _in_pty(*args)
    lines = _table_lines(text)
    assert lines, text[-2000:]
    assert max(len(line) for line in lines) <= 80
    cells = " ".join(part.strip() for line in lines for part in line.replace("┃", "│").split("│"))
    for name in identifiers:
        assert name in cells.split(), (name, text[-3000:])
