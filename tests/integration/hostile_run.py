"""Run calctl in a child with a memory ceiling and a deadline: a hostile input that would hang or balloon the
test process (what these tests guard against) ends the child instead, and the test fails saying so."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Address space a refused input may use: the interpreter with numpy, tokenizers and gguf loaded is ~1 GiB of
#: mappings; a bomb of issue 54 went past 3 GiB.
ADDRESS_SPACE = 3 * 1024**3
DEADLINE_S = float(
    os.environ.get("CALCTL_TEST_HOSTILE_DEADLINE_S", "120")
)  # generous on a loaded host; refusals take < 2 s


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return " ".join((self.out + self.err).split())


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_bounded(*args: object, cwd: Path | None = None) -> Ran:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    try:
        r = subprocess.run(
            [sys.executable, "-m", "calctl", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env=env,
            cwd=cwd,
            preexec_fn=_limit,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"calctl {' '.join(map(str, args))} still ran after {DEADLINE_S} s") from None
    return Ran(r.returncode, r.stdout, r.stderr)
