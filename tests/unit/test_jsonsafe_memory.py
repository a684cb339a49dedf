"""calctl.jsonsafe's prescan runs in memory bounded by one piece of the document, not by its values, and stops
at the first piece that crosses a limit (issue 54: millions of empty strings in a 15.6 MB safetensors header
cost 1 GB in a ``re.sub`` before the value count refused them)."""

from __future__ import annotations

import contextlib
import json
import tracemalloc

import pytest

from calctl import jsonsafe

#: Extra memory the scan may use, whatever the document: a few arrays of one piece.
SCAN_BUDGET = 16 * 1024**2


def _peak(fn: object, *args: object) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(jsonsafe.JsonRefused):
            fn(*args)  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _empty_strings(n_bytes: int) -> bytes:
    return b"[" + b",".join([b'""'] * (n_bytes // 3)) + b"]"


def test_millions_of_empty_strings_are_refused_within_a_small_fixed_memory() -> None:
    doc = _empty_strings(16 * 1024**2)
    assert _peak(jsonsafe.check_structure, doc) < SCAN_BUDGET
    with pytest.raises(jsonsafe.JsonRefused, match=r"more than the 200,000 a JSON document may hold") as info:
        jsonsafe.loads(doc)
    assert info.value.kind == "values"


def test_the_whole_document_is_scanned_in_the_same_memory() -> None:
    doc = _empty_strings(16 * 1024**2)
    assert _peak(jsonsafe.structure, doc) < SCAN_BUDGET
    assert jsonsafe.structure(doc) == (1, len(doc) // 3 + 1)  # the array and its strings


def test_a_megabyte_of_digits_is_refused_before_the_decoder_converts_it() -> None:
    with pytest.raises(jsonsafe.JsonRefused, match="digits") as info:
        jsonsafe.loads(b'{"eps": 1.' + b"1" * 1_000_000 + b"}")
    assert info.value.kind == "digits"
    assert jsonsafe.loads(b'{"eps": 1e-06, "s": "' + b"1" * 5000 + b'"}')["eps"] == 1e-06


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64])
def test_strings_escapes_and_runs_that_straddle_pieces_count_as_in_one_piece(
    piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = {'a"[\\': ["\\\\", '\\"{', [[1234567, -0.5e10]]], "b\\": {"c": ']]]\\\\\\"[[['}, "d": [[[[]]]]}
    data = json.dumps(doc).encode()
    whole = jsonsafe.structure(data)
    monkeypatch.setattr(jsonsafe, "_CHUNK", piece)
    assert jsonsafe.structure(data) == whole == (5, 15)
    assert jsonsafe.loads(data) == doc
