"""Issue 54: a GGUF's entries cost little each and their number is bounded by what real files hold: 2^20 empty
strings (8 MB) cost 16 s and 1.74 GB inside the gguf library's reader, 65,535 metadata keys 280 MB, 65,536
tensors 403 MB. calctl reads the header itself (:mod:`calctl.compiler.importer.gguf_header`); each file below is
refused in a child with a memory ceiling, naming the key or table, the figure and the limit."""

from __future__ import annotations

import struct
from pathlib import Path

from calctl import limits
from tests.conftest import TEST_KEY
from tests.integration.hostile_run import Ran, run_bounded
from tests.integration.test_declared_numbers_hostile import gguf_bytes, llama_metadata


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _import(tmp_path: Path, data: bytes) -> Ran:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    return run_bounded("import", "gguf", path, tmp_path / "out", "--key", TEST_KEY)


def _strings(key: str, items: list[bytes]) -> bytes:
    body = b"".join(struct.pack("<Q", len(x)) + x for x in items)
    return _s(key) + struct.pack("<IIQ", 9, 8, len(items)) + body


def test_a_vocabulary_of_2_20_empty_strings_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    """The tester's 8 MB file: its metadata declares a vocabulary of 384, its tokens 2^20 (empty) entries; the
    count is compared before any entry is decoded (the empty-token check itself: test_gguf_declared.py)."""
    kvs = [*llama_metadata(), _strings("tokenizer.ggml.tokens", [b""] * limits.MAX_VOCAB.maximum)]
    r = _import(tmp_path, gguf_bytes(kvs))
    assert r.code == 2 and "hostile.gguf" in r.text, r.text
    assert "tokenizer.ggml.tokens holds 1,048,576 tokens, more than the model's vocabulary of 384" in r.text, r.text


def test_65535_metadata_keys_are_refused_by_the_key_limit(tmp_path: Path) -> None:
    kvs = [_s(f"k.{i}") + struct.pack("<IB", 0, 1) for i in range(65_535)]
    r = _import(tmp_path, gguf_bytes(kvs))
    assert r.code == 2, r.text
    assert "65,535 entries" in r.text and "calctl.limits.MAX_GGUF_KEYS" in r.text, r.text


def test_65536_tensors_are_refused_by_the_tensor_limit(tmp_path: Path) -> None:
    info = b"".join(_s(f"t{i}") + struct.pack("<IQIQ", 1, 1, 0, 0) for i in range(65_536))
    r = _import(tmp_path, gguf_bytes(llama_metadata(), tensors=65_536, tensor_infos=info))
    assert r.code == 2, r.text
    assert "65,536 entries" in r.text and "calctl.limits.MAX_GGUF_TENSORS" in r.text, r.text


def test_tensors_the_block_count_does_not_imply_are_refused_before_their_data_is_read(tmp_path: Path) -> None:
    info = b"".join(_s(f"blk.{i}.attn_q.weight") + struct.pack("<IQIQ", 1, 1, 0, 0) for i in range(5_000))
    r = _import(tmp_path, gguf_bytes(llama_metadata(), tensors=5_000, tensor_infos=info))
    assert r.code == 2, r.text
    assert "5,000 tensors, more than the 21 a llama of 2 blocks has" in r.text, r.text


def test_an_array_of_a_million_empty_arrays_is_refused(tmp_path: Path) -> None:
    n = 1 << 20
    kv = _s("x.y") + struct.pack("<IIQ", 9, 9, n) + struct.pack("<IQ", 0, 0) * n
    r = _import(tmp_path, gguf_bytes([*llama_metadata(), kv]))
    assert r.code == 2 and "'x.y': an array of 1,048,576 arrays" in r.text, r.text


def test_string_arrays_over_the_header_total_are_refused(tmp_path: Path) -> None:
    third = limits.MAX_GGUF_ARRAY_ITEMS.maximum // 3 + 1
    kvs = [*llama_metadata(), *(_strings(f"a.{k}", [b"x"] * third) for k in ("one", "two", "three"))]
    r = _import(tmp_path, gguf_bytes(kvs))
    assert r.code == 2 and "'a.three'" in r.text and "calctl.limits.MAX_GGUF_ARRAY_ITEMS" in r.text, r.text


def test_a_valid_header_with_one_more_byte_of_a_declared_string_is_refused(tmp_path: Path) -> None:
    kvs = [*llama_metadata(), _s("general.name") + struct.pack("<IQ", 8, 2**63) + b"x"]
    r = _import(tmp_path, gguf_bytes(kvs))
    assert r.code == 2 and "'general.name'" in r.text and "9,223,372,036,854,775,808 bytes" in r.text, r.text


def test_a_chat_template_that_would_run_for_hours_is_refused(tmp_path: Path) -> None:
    """jinja2's sandbox caps one range at 100,000 but not two nested ones: the template is code the file declares,
    rendered at import (golden) and by serve for every request."""
    import gguf

    from tests.unit.compiler.test_gguf_declared import _gguf

    loops = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"

    def edit(kvs: dict) -> None:
        kvs["tokenizer.chat_template"] = (loops, gguf.GGUFValueType.STRING, None)

    path = _gguf(tmp_path, edit)
    r = run_bounded("import", "gguf", path, tmp_path / "out", "--key", TEST_KEY)
    assert r.code == 2, r.text
    assert "m.gguf: the chat template is too costly to render" in r.text and "1,000,000 steps" in r.text, r.text


def test_merges_out_of_proportion_to_the_tokens_are_refused_before_they_are_decoded(tmp_path: Path) -> None:
    """A GGUF's merges become a tokenizer.json: held to the same bound (4 per token, plus 1,024) before the
    tokenizers library builds a million of them."""
    tokens = [f"t{i}".encode() for i in range(300)]
    kvs = [
        *llama_metadata(),
        _strings("tokenizer.ggml.tokens", tokens),
        _strings("tokenizer.ggml.merges", [b"t1 t2"] * 1_000_000),
    ]
    r = _import(tmp_path, gguf_bytes(kvs))
    assert r.code == 2 and "tokenizer.ggml.merges holds 1,000,000 entries, more than 2,224" in r.text, r.text
