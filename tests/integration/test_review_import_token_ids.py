"""A token id beyond the vocabulary is refused at import, naming the file and key (it used to import, then fail GOLD003)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf

from tests.conftest import TEST_KEY
from tests.unit.compiler.checkpoint_factory import write_gguf, write_hf_dir


def test_a_gguf_eos_id_outside_the_vocabulary_exits_2_and_leaves_nothing(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
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


def test_an_hf_bos_id_outside_the_vocabulary_names_config_json(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    d, cfg, _ = write_hf_dir(tmp_path / "hf", "qwen2")
    (d / "config.json").write_text(json.dumps({**cfg, "bos_token_id": cfg["vocab_size"]}))
    r = cli("import", "hf", d, tmp_path / "pkg", "--key", TEST_KEY)
    assert r.code == 2, r.err
    assert f"config.json: bos_token_id {cfg['vocab_size']} is outside the vocabulary" in " ".join(r.err.split())
    assert not (tmp_path / "pkg").exists()
