"""Read a GGUF file's header with every declared count checked before it costs anything.

The ``gguf`` library's reader trusts the header and builds numpy objects per
metadata array element and per tensor: a 49-byte file whose array declares 10^9
strings loops 10^9 times, 2^20 empty strings (8 MB) cost 16 s and 1.7 GB, 65,536
tensors 403 MB (issue 54). calctl therefore never hands a GGUF to that reader:
:func:`read_header` walks the header itself, one field at a time, against the
file's size and :mod:`calctl.limits`, and keeps

* scalar values (numbers, booleans, strings of at most :data:`MAX_STRING_BYTES`);
* an :class:`ArrayRef` per metadata array (element type, count, byte range),
  decoded only on demand (:meth:`GgufHeader.strings`, :meth:`GgufHeader.numbers`:
  numeric arrays in one numpy call, string arrays one ``decode`` per element);
* a :class:`TensorInfo` per tensor (name, dimensions, type, offset, byte range),
  the data later viewed through one ``np.memmap``.

The only per-element work is the walk over string arrays (to find where the next
key starts), bounded in total by ``limits.MAX_GGUF_ARRAY_ITEMS``. Any count or
length that the rest of the file cannot hold, or that the table does not allow,
is a CheckpointError (exit 2) naming the file, the key, the count and the limit.

The format (ggml's docs/gguf.md, versions 2 and 3): magic, version u32, tensor
count u64, key/value count u64; each key a string (u64 length, bytes), a value
type u32 and the value (an array: element type u32, count u64, elements); then
each tensor's name, dimension count u32, dimensions u64, type u32, offset u64;
the data at the next multiple of ``general.alignment`` (32 by default). A file
written big-endian is read big-endian.

This module decodes no tensor data and knows no model family.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from calctl import limits
from calctl.compiler.importer.families import CheckpointError

#: GGUF value types -> (bytes of one value, struct code, numpy code).
_SCALARS = {
    0: (1, "B", "u1"),
    1: (1, "b", "i1"),
    2: (2, "H", "u2"),
    3: (2, "h", "i2"),
    4: (4, "I", "u4"),
    5: (4, "i", "i4"),
    6: (4, "f", "f4"),
    7: (1, "?", "u1"),
    10: (8, "Q", "u8"),
    11: (8, "q", "i8"),
    12: (8, "d", "f8"),
}
_BOOL, _STRING, _ARRAY = 7, 8, 9
ByteOrder = Literal["<", ">"]
_TYPE_NAMES = {**dict.fromkeys(range(6), "integers"), 6: "floats", 7: "booleans", 8: "strings", 9: "arrays"}
_TYPE_NAMES.update({10: "integers", 11: "integers", 12: "floats"})
#: ggml's GGML_MAX_DIMS.
MAX_TENSOR_DIMS = 4
#: Arrays inside arrays: the format allows them, no model file nests them and llama.cpp's reader refuses them;
#: so does calctl (walking them cost a Python call per element: 12 MB of empty nested arrays, 6 s).
MAX_ARRAY_NESTING = 1
#: gguf.md: "keys are ... at most 2^16-1 bytes".
MAX_KEY_BYTES = 65535
#: No GGML type stores a weight in less than one bit (IQ1_S: 1.56 bits), so a tensor holds at most 8 per byte.
MAX_ELEMENTS_PER_BYTE = 8
#: A string value (not an array element): the longest real one is a chat template of ~10 KB.
MAX_STRING_BYTES = 1024 * 1024
#: ``general.alignment``: a power of two; llama.cpp writes 32.
MAX_ALIGNMENT = 1 << 16


@dataclass(frozen=True)
class ArrayRef:
    """A metadata array not yet decoded: element type, count, and where its elements lie in the file."""

    etype: int
    count: int
    start: int
    end: int

    def __repr__(self) -> str:  # what an error message shows when an array stands where a value was expected
        return f"<an array of {self.count:,} {_TYPE_NAMES.get(self.etype, 'values')}>"


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table; ``dims`` in GGUF order (innermost first), ``offset`` from the data start."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class GgufHeader:
    """What :func:`read_header` found; metadata values are scalars, strings or :class:`ArrayRef`."""

    path: Path
    size: int
    order: ByteOrder
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int
    _mm: Any = field(repr=False, default=None)
    alignment: int = 32  # general.alignment: every tensor's offset is a multiple of it

    def strings(self, key: str, *, distinct: bool = False) -> list[str]:
        """The string array ``key``, each element UTF-8; with ``distinct``, an empty or repeated element is refused
        naming its index (a tokenizer whose tokens are empty or repeated cannot be built or served)."""
        ref = self.metadata[key]
        if not isinstance(ref, ArrayRef) or ref.etype != _STRING:
            raise CheckpointError(self.path, f"metadata key {key!r}: expected an array of strings")
        out: list[str] = []
        seen: dict[str, int] = {}
        pos, fmt = ref.start, self.order + "Q"
        for i in range(ref.count):
            (n,) = struct.unpack_from(fmt, self._mm, pos)
            raw = self._mm[pos + 8 : pos + 8 + n]
            pos += 8 + n
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CheckpointError(self.path, f"{key}[{i}]: not UTF-8 (byte {exc.start}: {raw[:40]!r})") from None
            if distinct:
                if not text:
                    raise CheckpointError(
                        self.path, f"{key}[{i}] is an empty string: every token of a vocabulary must have text"
                    )
                first = seen.setdefault(text, i)
                if first != i:
                    raise CheckpointError(
                        self.path,
                        f"{key}[{i}] {text[:60]!r} repeats {key}[{first}]: a vocabulary's tokens are distinct",
                    )
            out.append(text)
        return out

    def numbers(self, key: str) -> list[Any]:
        """The numeric array ``key`` as a list of Python numbers (one numpy call)."""
        ref = self.metadata[key]
        if not isinstance(ref, ArrayRef) or ref.etype not in _SCALARS:
            raise CheckpointError(self.path, f"metadata key {key!r}: expected an array of numbers")
        code = _SCALARS[ref.etype][2]
        arr = np.frombuffer(self._mm, dtype=np.dtype(code).newbyteorder(self.order), count=ref.count, offset=ref.start)
        values: list[Any] = arr.astype(bool if ref.etype == _BOOL else arr.dtype.newbyteorder("=")).tolist()
        return values

    def tensor_data(self, t: TensorInfo, n_bytes: int) -> np.ndarray:
        """The tensor's bytes (read-only, mapped from the file)."""
        return np.frombuffer(self._mm, dtype=np.uint8, count=n_bytes, offset=self.data_start + t.offset)


@dataclass
class _Walk:
    """A position in the mapped file; every read is checked against the file's size first."""

    mm: Any
    path: Path
    size: int
    order: ByteOrder = "<"
    pos: int = 0
    walked: int = 0  # string elements walked one by one (limits.MAX_GGUF_ARRAY_ITEMS)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise CheckpointError(
                self.path,
                f"truncated or corrupt GGUF: {what} at byte {self.pos} needs {n:,} bytes, "
                f"the file holds {self.size - self.pos:,} more",
                hint="expected a complete GGUF v2/v3 file; re-download or re-convert it",
            )

    def scalar(self, vtype: int, what: str) -> Any:
        size, code, _ = _SCALARS[vtype]
        self.need(size, what)
        (value,) = struct.unpack_from(self.order + code, self.mm, self.pos)
        self.pos += size
        return value

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def text(self, limit: int, what: str, *, strict: bool = False) -> str:
        """A length-prefixed string; with ``strict`` (key and tensor names) bytes that are not UTF-8 are refused
        with their offset, where a value's are shown escaped."""
        n = self.scalar(10, f"{what}: length")
        if n > limit:
            raise CheckpointError(self.path, f"{what}: a string of {n:,} bytes (at most {limit:,} are read)")
        self.need(n, what)
        start = self.pos
        raw = self.mm[start : start + n]
        self.pos += n
        if strict:
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                shown = raw.decode("utf-8", "backslashreplace")
                raise CheckpointError(
                    self.path,
                    f"{what}: its bytes are not valid UTF-8 (byte 0x{raw[exc.start]:02x} at file offset "
                    f"{start + exc.start:,}; read as {shown!r}); GGUF names are UTF-8 strings",
                ) from None
        return raw.decode("utf-8", "backslashreplace")

    def count(self, n: int, least: int, what: str, limit: limits.Limit) -> None:
        """Refuse a declared count over ``limit`` or more elements of ``least`` bytes than the file has left."""
        if n > limit.maximum:
            raise CheckpointError(
                self.path,
                f"{what} declares {n:,} entries, over the limit of {limit.maximum:,} {limit.fact} "
                f"(calctl.limits.{limit.name}; {limit.why}); refused before reading them",
            )
        self.need(n * least, f"{what} ({n:,} entries of at least {least} bytes)")

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, f"metadata key {key!r}")
        if vtype == _STRING:
            return self.text(MAX_STRING_BYTES, f"metadata key {key!r}")
        if vtype != _ARRAY:
            raise CheckpointError(self.path, f"metadata key {key!r}: unknown value type {vtype} (expected 0..12)")
        etype = self.scalar(4, f"metadata key {key!r}: array type")
        if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
            raise CheckpointError(self.path, f"metadata key {key!r}: unknown array element type {etype}")
        n = self.scalar(10, f"metadata key {key!r}: array length")
        least = _SCALARS[etype][0] if etype in _SCALARS else 8 if etype == _STRING else 12
        self.count(n, least, f"metadata key {key!r}: the array", limits.MAX_VOCAB)
        start = self.pos
        if etype in _SCALARS:
            self.skip(n * least, f"metadata key {key!r}: array data")
            return ArrayRef(etype, n, start, self.pos)
        self.walked += n
        if self.walked > limits.MAX_GGUF_ARRAY_ITEMS.maximum:
            lim = limits.MAX_GGUF_ARRAY_ITEMS
            raise CheckpointError(
                self.path,
                f"metadata key {key!r}: the header's string arrays hold {self.walked:,} strings so far, "
                f"over the limit of {lim.maximum:,} {lim.fact} (calctl.limits.{lim.name}; {lim.why})",
            )
        if etype == _ARRAY:
            raise CheckpointError(
                self.path,
                f"metadata key {key!r}: an array of {n:,} arrays; arrays nest at most {MAX_ARRAY_NESTING} deep "
                "(no model file nests them, llama.cpp refuses them too)",
            )
        length, mm, size = struct.Struct(self.order + "Q").unpack_from, self.mm, self.size
        pos = start
        for i in range(n):  # the one per-element loop; n and the running total are bounded above
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"metadata key {key!r}: element {i}")
            pos += 8 + length(mm, pos)[0]
        self.pos = start
        self.need(pos - start, f"metadata key {key!r}: {n:,} strings")
        self.pos = pos
        return ArrayRef(etype, n, start, self.pos)

    def tensor(self, index: int, seen: set[str]) -> TensorInfo:
        name = self.text(MAX_KEY_BYTES, f"tensor {index}: name", strict=True)
        if name in seen:
            raise CheckpointError(self.path, f"tensor {index}: the name {name!r} appears twice in the tensor table")
        seen.add(name)
        n_dims = self.scalar(4, f"tensor {name!r}: dimension count")
        if n_dims > MAX_TENSOR_DIMS:
            raise CheckpointError(
                self.path, f"tensor {name!r}: {n_dims} dimensions (ggml has at most {MAX_TENSOR_DIMS})"
            )
        dims = tuple(self.scalar(10, f"tensor {name!r}: dimension {d}") for d in range(n_dims))
        info = TensorInfo(
            name, dims, self.scalar(4, f"tensor {name!r}: type"), self.scalar(10, f"tensor {name!r}: offset")
        )
        if info.elements > self.size * MAX_ELEMENTS_PER_BYTE:
            raise CheckpointError(
                self.path,
                f"tensor {name!r} declares {info.elements:,} elements; a {self.size:,}-byte file holds at most "
                f"{self.size * MAX_ELEMENTS_PER_BYTE:,} (no GGML type stores less than a bit per weight)",
            )
        return info


def _open(path: Path) -> tuple[Any, int]:
    size = path.stat().st_size
    if size < 24:
        raise CheckpointError(
            path,
            f"truncated or corrupt GGUF: {size} bytes, a GGUF header alone takes 24",
            hint="expected a complete GGUF v2/v3 file; re-download or re-convert it",
        )
    with path.open("rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size


def read_header(path: Path) -> GgufHeader:
    """Walk ``path``'s GGUF header; CheckpointError (exit 2) for any count or length it cannot hold."""
    mm, size = _open(path)
    walk = _Walk(mm, path, size)
    if mm[:4] != b"GGUF":
        raise CheckpointError(path, "not a GGUF file (it does not start with the magic 'GGUF')")
    walk.pos = 4
    version = walk.scalar(4, "the version")
    if version & 0xFFFF == 0:  # written on a big-endian host (the gguf library's own test)
        walk.order, version = ">", struct.unpack(">I", mm[4:8])[0]
    if version not in (2, 3):
        raise CheckpointError(path, f"GGUF version {version}: expected 2 or 3")
    tensors = walk.scalar(10, "the tensor count")
    keys = walk.scalar(10, "the metadata key count")
    walk.count(keys, 8 + 4 + 1, "the metadata", limits.MAX_GGUF_KEYS)
    walk.count(tensors, 8 + 4 + 12, "the tensor table", limits.MAX_GGUF_TENSORS)
    metadata: dict[str, Any] = {}
    for i in range(keys):
        key = walk.text(MAX_KEY_BYTES, f"metadata key {i}: name", strict=True)
        if key in metadata:
            raise CheckpointError(path, f"metadata key {key!r} appears twice (keys {i} and an earlier one)")
        metadata[key] = walk.value(walk.scalar(4, f"metadata key {key!r}: value type"), key)
    seen: set[str] = set()
    infos = [walk.tensor(i, seen) for i in range(tensors)]
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or not 0 < alignment <= MAX_ALIGNMENT:
        raise CheckpointError(path, f"general.alignment {alignment!r}: expected a power of two up to {MAX_ALIGNMENT}")
    if alignment & (alignment - 1):
        raise CheckpointError(path, f"general.alignment {alignment}: expected a power of two")
    data_start = -(-walk.pos // alignment) * alignment
    return GgufHeader(path, size, walk.order, metadata, infos, data_start, mm, alignment)
