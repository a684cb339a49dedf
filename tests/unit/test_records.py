"""The one atomic file writer and the default report directory (calctl.records)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from calctl import records


def test_write_json_replaces_in_one_step_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "r.json"
    records.write_json(path, {"status": "running"})
    records.write_json(path, {"status": "finished"})
    assert json.loads(path.read_text())["status"] == "finished"
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]


def test_a_failing_writer_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), records.atomic_output(path) as tmp:
        assert tmp.suffix == ".png"  # matplotlib picks the format from the suffix
        tmp.write_bytes(b"half")
        raise RuntimeError("crash mid-write")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_a_writer_that_writes_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), records.atomic_output(tmp_path / "x.bin"):
        pass
    assert not list(tmp_path.iterdir())


def test_write_atomic_sets_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "checksums.sha256"
    records.write_atomic(path, b"abc", mode=0o640)
    assert path.read_bytes() == b"abc"
    assert path.stat().st_mode & 0o777 == 0o640


def test_default_report_dir_is_one_documented_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.delenv(records.REPORT_DIR_ENV, raising=False)
    assert records.default_report_dir("soak", now) == Path("calctl-reports/soak-20260102-030405")
    monkeypatch.setenv(records.REPORT_DIR_ENV, "/var/tmp/evidence")
    assert records.default_report_dir("bringup", now) == Path("/var/tmp/evidence/bringup-20260102-030405")


# Moves a whole package directory, built next to its destination, into place: not a file write.
DIRECTORY_MOVES = {"compiler/writer.py"}


def test_no_other_module_renames_a_temporary_file_itself() -> None:
    root = Path(records.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "records.py"
        and str(p.relative_to(root)) not in DIRECTORY_MOVES
        and "os.replace(" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_an_ndjson_record_is_one_line_of_plain_json_without_nan() -> None:
    """The one JSON writer for NDJSON evidence too: a non-finite figure is null (``json.dumps`` wrote ``NaN``,
    which no JSON reader accepts), and a record carries no ``schema_version`` of its own."""
    import json as _json

    from calctl.records import dumps_line

    line = dumps_line({"t": float("nan"), "chips": (0, 1), "ok": True})
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert _json.loads(line) == {"t": None, "chips": [0, 1], "ok": True}


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling symlink", "directory"])
def test_an_output_never_replaces_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    """A FIFO, a device, a symlink or a directory at an output path is a usage error and stays as it was (as
    root, ``--report /dev/zero`` renamed a JSON file over the device)."""
    import os

    from calctl.errors import UsageError

    target = tmp_path / "out.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "real.json").write_text("{}")
        target.symlink_to("real.json")
    elif kind == "dangling symlink":
        target.symlink_to(target)
    else:
        target.mkdir()
    before = os.lstat(target)
    with pytest.raises(UsageError, match="not a regular file; calctl writes regular files only"):
        records.write_atomic(target, b"{}")
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_a_runner_refuses_a_fifo_report_before_it_runs(tmp_path: Path) -> None:
    import os

    from tests.conftest import run_in_process

    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    for option in ("--report", "--trace", "--plot"):
        r = run_in_process("run-golden", option, fifo, "--allow-unsigned")
        assert r.code == 2, r.err
        assert f"{option} {fifo}: is a FIFO, not a regular file" in r.err
    assert os.path.exists(fifo) and not os.path.isfile(fifo)


def test_a_cache_directory_that_cannot_be_one_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CALCTL_CACHE_DIR=/dev/null, a FIFO or a symlink loop was an internal error when the reference board or
    the sample packages were built into it."""
    import os

    from calctl import cache
    from calctl.errors import ConfigError

    fifo, loop = tmp_path / "fifo", tmp_path / "loop"
    os.mkfifo(fifo)
    loop.symlink_to(loop)
    for bad, words in (
        (fifo, "is a FIFO, not a directory"),
        (fifo / "sub", "in its path, is a FIFO, not a directory"),
        (loop, "cannot be inspected"),
    ):
        monkeypatch.setenv("CALCTL_CACHE_DIR", str(bad))
        with pytest.raises(ConfigError, match=f"CALCTL_CACHE_DIR={bad}: .*{words}"):
            cache.cache_dir()
    monkeypatch.setenv("CALCTL_CACHE_DIR", str(tmp_path / "new"))
    assert cache.cache_dir() == tmp_path / "new" and not (tmp_path / "new").exists()
