"""Issue 54: a file of a Hugging Face directory that exists but is not a regular file (a FIFO, a device, a
directory, a symlink loop) is refused naming it and what it is; it used to be skipped (optional files) or called
"missing" (config.json)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from calctl.compiler.importer.families import CheckpointError
from calctl.compiler.importer.hf import read_hf_dir
from tests.unit.compiler.checkpoint_factory import write_hf_dir


def _make(path: Path, kind: str) -> None:
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    else:  # a symlink loop
        path.symlink_to(path.name)


@pytest.mark.parametrize(
    ("name", "kind", "what"),
    [
        ("generation_config.json", "fifo", "is a FIFO"),
        ("generation_config.json", "devzero", "is a symlink to a character device"),
        ("generation_config.json", "dir", "is a directory"),
        ("chat_template.jinja", "fifo", "is a FIFO"),
        ("special_tokens_map.json", "fifo", "is a FIFO"),
        ("config.json", "fifo", "is a FIFO"),
        ("config.json", "dir", "is a directory"),
        ("config.json", "loop", "is a symlink that cannot be followed"),
        ("tokenizer.json", "devzero", "is a symlink to a character device"),
    ],
)
def test_a_special_file_is_refused_naming_it_and_what_it_is(tmp_path: Path, name: str, kind: str, what: str) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    _make(d / name, kind)
    with pytest.raises(CheckpointError, match=re.escape(name) + f": {what}.*expected a regular file"):
        read_hf_dir(d)


def test_a_symlink_to_a_regular_file_is_read_as_the_hub_cache_lays_it_out(tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    shutil.move(d / "config.json", blobs / "abc123")
    (d / "config.json").symlink_to(blobs / "abc123")
    assert read_hf_dir(d).config.n_layers == 2
