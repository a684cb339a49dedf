"""Token ids at import: one beyond the vocabulary is refused, naming the file and key (it used to import, then fail
GOLD003); a GGUF with no end-of-sequence id imports with a note that says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest

from tests.conftest import TEST_KEY, TEST_PUB, Cli
from tests.unit.compiler.checkpoint_factory import write_gguf, write_hf_dir


def test_a_gguf_eos_id_outside_the_vocabulary_exits_2_and_leaves_nothing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, cfg, w = write_hf_dir(tmp_path / "hf", "llama")
    real = gguf.GGUFWriter.add_eos_token_id
    monkeypatch.setattr(gguf.GGUFWriter, "add_eos_token_id", lambda self, _i: real(self, 99999))
    path = write_gguf(tmp_path / "bad-eos.gguf", d, cfg, w)
    monkeypatch.undo()
    (tmp_path / "out").mkdir()
    r = cli("import", "gguf", path, tmp_path / "out" / "pkg", "--key", TEST_KEY)
    assert r.code == 2, r.err
    assert "bad-eos.gguf: tokenizer.ggml.eos_token_id 99999 is outside the vocabulary" in " ".join(r.err.split())
    assert list((tmp_path / "out").iterdir()) == []


def test_an_hf_bos_id_outside_the_vocabulary_names_config_json(cli: Cli, tmp_path: Path) -> None:
    d, cfg, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    (d / "config.json").write_text(json.dumps({**cfg, "bos_token_id": cfg["vocab_size"]}))
    r = cli("import", "hf", d, tmp_path / "pkg", "--key", TEST_KEY)
    assert r.code == 2, r.err
    assert f"config.json: bos_token_id {cfg['vocab_size']} is outside the vocabulary" in " ".join(r.err.split())
    assert not (tmp_path / "pkg").exists()


def test_a_gguf_without_an_eos_token_imports_with_a_note_that_says_so(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tokenizer.ggml.eos_token_id: the model imports (it is a valid checkpoint), and the report says that
    generation never stops on its own (it used to import silently)."""
    d, cfg, w = write_hf_dir(tmp_path / "hf", "llama")
    monkeypatch.setattr(gguf.GGUFWriter, "add_eos_token_id", lambda self, _i: None)
    path = write_gguf(tmp_path / "no-eos.gguf", d, cfg, w)
    monkeypatch.undo()
    r = cli("import", "gguf", path, tmp_path / "pkg", "--key", TEST_KEY, "-f", "json")
    assert r.code == 0, r.err
    (note,) = [n for n in r.json["notes"] if "end-of-sequence" in n]
    assert note.startswith("no-eos.gguf: no end-of-sequence token (tokenizer.ggml.eos_token_id)"), note
    assert "every request runs to its max_tokens" in note
    r = cli("import", "gguf", path, tmp_path / "pkg2", "--key", TEST_KEY)
    assert r.code == 0 and "no end-of-sequence token" in " ".join(r.err.split()), r.err
    assert cli("validate", tmp_path / "pkg", "--trusted-key", str(TEST_PUB)).code == 0


def _one_id_twice(doc: dict[str, Any]) -> None:
    vocab = doc["model"]["vocab"]
    vocab[list(vocab)[-1]] = vocab[list(vocab)[-2]]


def _unknown_unk(doc: dict[str, Any]) -> None:
    doc["model"]["unk_token"] = "<never-a-token>"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_one_id_twice, "model.vocab: 1 token id(s) used by more than one token"),
        (_unknown_unk, "model.unk_token '<never-a-token>' is not in the vocabulary"),
    ],
    ids=["id-twice", "unk-unknown"],
)
def test_an_hf_vocabulary_wrong_by_value_is_refused_naming_tokenizer_json(
    cli: Cli, tmp_path: Path, edit: Callable[[dict[str, Any]], None], match: str
) -> None:
    hf, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    doc = json.loads((hf / "tokenizer.json").read_text())
    edit(doc)
    (hf / "tokenizer.json").write_text(json.dumps(doc))
    r = cli("import", "hf", hf, tmp_path / "pkg", "--key", TEST_KEY)
    assert r.code == 2, r.err
    err = " ".join(r.err.split())
    assert "tokenizer.json" in err and match in err
    assert not (tmp_path / "pkg").exists()
