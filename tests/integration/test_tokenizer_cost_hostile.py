"""Issue 54: a tokenizer.json whose parts are past the table's limits is refused from its bytes, before the
tokenizers library builds it (4 million entries cost it 16 s and 1.1 GB), in every path that loads a tokenizer:
``validate`` (TOK001), ``import hf`` (exit 2) and the serving text codec (``serve``, refused at load)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl import limits
from calctl.errors import ConfigError
from tests.conftest import TEST_KEY, Cli
from tests.unit.compiler.checkpoint_factory import write_hf_dir
from tests.unit.validate.validate_factory import copy_package, reseal, validate_json


def _hostile(path: Path) -> None:
    """A BPE vocabulary of one entry past ``limits.MAX_VOCAB``, in short keys (19 MB)."""
    n = limits.MAX_VOCAB.maximum + 1
    doc = {"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(n)}}}
    path.write_text(json.dumps(doc, separators=(",", ":")))


def test_import_hf_refuses_a_vocabulary_past_the_table_naming_file_part_and_limit(cli: Cli, tmp_path: Path) -> None:
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    _hostile(d / "tokenizer.json")
    r = cli("import", "hf", d, tmp_path / "pkg", "--key", TEST_KEY)
    text = " ".join(r.err.split())
    assert r.code == 2, text
    # refused by the tighter of the two bounds: the table's or the model's own vocab_size (config.json: 384)
    bound = "calctl.limits.MAX_VOCAB" in text or "the model's vocab_size of 384" in text
    assert "tokenizer.json" in text and "under key 'vocab'" in text and bound, text
    assert not (tmp_path / "pkg").exists()


def test_validate_refuses_it_in_a_package_with_tok001(cli: Cli, tmp_path: Path) -> None:
    pkg = copy_package(tmp_path, "single")
    (tok,) = pkg.glob("tokenizer/*/tokenizer.json")
    _hostile(tok)
    reseal(pkg)
    code, doc = validate_json(cli, pkg)
    (tok001,) = [c for c in doc["checks"] if c["id"] == "TOK001" and c["status"] == "fail"]
    message = tok001["message"]
    assert code == 1 and ("calctl.limits.MAX_VOCAB" in message or "the model's vocab_size" in message), tok001


def test_import_hf_refuses_an_added_token_whose_declared_id_the_library_ignores(cli: Cli, tmp_path: Path) -> None:
    """tokenizers assigns added tokens its own ids: a file declaring another one is read differently elsewhere."""
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama")
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["added_tokens"][0]["id"] = 123_456
    (d / "tokenizer.json").write_text(json.dumps(doc))
    r = cli("import", "hf", d, tmp_path / "pkg", "--key", TEST_KEY)
    text = " ".join(r.err.split())
    assert r.code == 2 and "tokenizer.json" in text and "added_tokens[0]" in text and "declares id 123456" in text, text


def test_the_serving_text_codec_refuses_it_before_loading(tmp_path: Path) -> None:
    from calctl.serving.text import TextCodec

    tok = tmp_path / "tokenizer.json"
    _hostile(tok)
    with pytest.raises(ConfigError, match=r"under key 'vocab'.*MAX_VOCAB"):
        TextCodec.from_files(tok, None, None)
