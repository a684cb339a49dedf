"""Walk a GGUF file's header with every declared count checked before the ``gguf`` library reads it.

The ``gguf`` library's reader trusts the header: a 49-byte file whose metadata
array declares 10^9 strings makes it loop 10^9 times over the end of the file,
and counts of tensors or keys size its lists (issue 54). :func:`prescan` reads
the same header itself, one field at a time, and refuses (CheckpointError, exit 2,
naming the file, the key, the count and the limit) any count or length that the
rest of the file cannot hold or that the one table (:mod:`calctl.limits`) does
not allow, before any of that work is done. Each count is compared with the
bytes left (every element takes at least one byte), so the walk is linear in
the file's header and never allocates what a count declares.

The format (ggml's docs/gguf.md, versions 2 and 3): magic, version u32, tensor
count u64, key/value count u64; each key a string (u64 length, bytes), a value
type u32 and the value (an array: element type u32, count u64, elements); then
each tensor's name, dimension count u32, dimensions u64, type u32, offset u64.
A file written big-endian is read big-endian, as the library does.

This module reads the header only; it does not decode values or tensors.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from calctl import limits
from calctl.compiler.importer.families import CheckpointError

#: GGUF value types -> bytes of one value (8 string and 9 array are variable).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
#: The least bytes one element of each kind takes in the file (a string's length, an array's type and count).
_LEAST_BYTES = {**_SCALAR_BYTES, _STRING: 8, _ARRAY: 12}
#: ggml's GGML_MAX_DIMS.
MAX_TENSOR_DIMS = 4
#: Arrays inside arrays: the format allows them, no model file nests them at all.
MAX_ARRAY_NESTING = 4
#: gguf.md: "keys are ... at most 2^16-1 bytes".
MAX_KEY_BYTES = 65535
#: No GGML type stores a weight in less than one bit (IQ1_S: 1.56 bits), so a tensor holds at most 8 per byte.
MAX_ELEMENTS_PER_BYTE = 8


@dataclass
class _Cursor:
    """A position in the open file; every read is checked against the file's size first."""

    fh: BinaryIO
    path: Path
    size: int
    order: str = "<"
    pos: int = 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise CheckpointError(
                self.path,
                f"truncated or corrupt GGUF: {what} at byte {self.pos} needs {n:,} bytes, "
                f"the file holds {self.size - self.pos:,} more",
                hint="expected a complete GGUF v2/v3 file; re-download or re-convert it",
            )

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = self.fh.read(n)
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n
        self.fh.seek(self.pos)

    def u32(self, what: str) -> int:
        value: int = struct.unpack(self.order + "I", self.take(4, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = struct.unpack(self.order + "Q", self.take(8, what))[0]
        return value

    def count(self, n: int, least: int, what: str, limit: limits.Limit) -> None:
        """Refuse a declared count over ``limit`` or more elements of ``least`` bytes than the file has left."""
        if n > limit.maximum:
            raise CheckpointError(
                self.path,
                f"{what} declares {n:,} entries, over the limit of {limit.maximum:,} {limit.fact} "
                f"(calctl.limits.{limit.name}); refused before reading them",
            )
        self.need(n * least, f"{what} ({n:,} entries of at least {least} bytes)")


def _skip_value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> None:
    if vtype in _SCALAR_BYTES:
        cur.skip(_SCALAR_BYTES[vtype], f"metadata key {key!r}")
    elif vtype == _STRING:
        cur.skip(cur.u64(f"metadata key {key!r}: string length"), f"metadata key {key!r}: string")
    elif vtype == _ARRAY:
        if depth >= MAX_ARRAY_NESTING:
            raise CheckpointError(cur.path, f"metadata key {key!r}: arrays nested more than {MAX_ARRAY_NESTING} deep")
        etype = cur.u32(f"metadata key {key!r}: array type")
        if etype not in _LEAST_BYTES:
            raise CheckpointError(cur.path, f"metadata key {key!r}: unknown array element type {etype}")
        n = cur.u64(f"metadata key {key!r}: array length")
        cur.count(n, _LEAST_BYTES[etype], f"metadata key {key!r}: the array", limits.MAX_VOCAB)
        if etype in _SCALAR_BYTES:
            cur.skip(n * _SCALAR_BYTES[etype], f"metadata key {key!r}: array data")
            return
        for _ in range(n):  # at most MAX_VOCAB, each element at least 8 bytes the file really holds
            _skip_value(cur, etype, key, depth + 1)
    else:
        raise CheckpointError(cur.path, f"metadata key {key!r}: unknown value type {vtype} (expected 0..12)")


def _key(cur: _Cursor, index: int) -> str:
    n = cur.u64(f"metadata key {index}: name length")
    if n > MAX_KEY_BYTES:
        raise CheckpointError(cur.path, f"metadata key {index}: a name of {n:,} bytes (GGUF allows {MAX_KEY_BYTES})")
    return cur.take(n, f"metadata key {index}: name").decode("utf-8", "replace")


def _tensor_info(cur: _Cursor, index: int) -> None:
    n = cur.u64(f"tensor {index}: name length")
    if n > MAX_KEY_BYTES:
        raise CheckpointError(cur.path, f"tensor {index}: a name of {n:,} bytes (GGUF allows {MAX_KEY_BYTES})")
    name = cur.take(n, f"tensor {index}: name").decode("utf-8", "replace")
    n_dims = cur.u32(f"tensor {name!r}: dimension count")
    if n_dims > MAX_TENSOR_DIMS:
        raise CheckpointError(cur.path, f"tensor {name!r}: {n_dims} dimensions (ggml has at most {MAX_TENSOR_DIMS})")
    elements = 1
    for d in range(n_dims):
        elements *= cur.u64(f"tensor {name!r}: dimension {d}")
    if elements > cur.size * MAX_ELEMENTS_PER_BYTE:
        raise CheckpointError(
            cur.path,
            f"tensor {name!r} declares {elements:,} elements; a {cur.size:,}-byte file holds at most "
            f"{cur.size * MAX_ELEMENTS_PER_BYTE:,} (no GGML type stores less than a bit per weight)",
        )
    cur.skip(4 + 8, f"tensor {name!r}: type and offset")


def prescan(path: Path) -> None:
    """Walk ``path``'s GGUF header; CheckpointError (exit 2) for any count or length it cannot hold."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        cur = _Cursor(fh, path, size)
        if cur.take(4, "the magic") != b"GGUF":
            raise CheckpointError(path, "not a GGUF file (it does not start with the magic 'GGUF')")
        raw = cur.take(4, "the version")
        version = struct.unpack("<I", raw)[0]
        if version & 0xFFFF == 0:  # written on a big-endian host (the library's own test)
            cur.order, version = ">", struct.unpack(">I", raw)[0]
        if version not in (2, 3):
            raise CheckpointError(path, f"GGUF version {version}: expected 2 or 3")
        tensors = cur.u64("the tensor count")
        keys = cur.u64("the metadata key count")
        cur.count(keys, 8 + 4 + 1, "the metadata", limits.MAX_GGUF_ENTRIES)
        cur.count(tensors, 8 + 4 + 12, "the tensor table", limits.MAX_GGUF_ENTRIES)
        for i in range(keys):
            key = _key(cur, i)
            _skip_value(cur, cur.u32(f"metadata key {key!r}: value type"), key)
        for i in range(tensors):
            _tensor_info(cur, i)
