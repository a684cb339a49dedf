"""Block-quantised parameter tensors (the GGML blocks q4_0, q4_1 and q8_0), kept as stored.

A package may store a weight matrix in the block format its checkpoint shipped in
(docs/package-format.md, "Quantised tensors"): 32 weights a block, one fp16 scale
(and, for q4_1, one fp16 minimum) per block, the blocks running along the matrix's
reduction axis. A :class:`QuantTensor` holds those bytes as ``rows`` rows of
blocks; the decoder's native kernel computes on them directly and
:meth:`QuantTensor.dequantize` is the exact float reference (numpy's ``__array__``
protocol makes ``np.asarray(q, dtype)`` the dequantised tensor in its manifest
shape).

Which axis is which: a matrix ``[in, out]`` (``y = x @ W``) is stored as ``out``
rows of ``in / 32`` blocks (GGML's own layout, the transpose of the manifest
shape); ``embed`` ``[vocab, d_model]`` is stored as ``vocab`` rows of
``d_model / 32`` blocks (its manifest shape). This module does no file I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Weights per block and bytes per block of each quantised dtype.
BLOCK_WEIGHTS = 32
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
QUANT_DTYPES = tuple(BLOCK_BYTES)
#: Tensors whose rows are their first manifest axis (every other quantised matrix is stored transposed).
ROW_MAJOR_TENSORS = frozenset({"embed"})


def stored_rows(name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """``(rows, cols)`` of the stored block matrix of tensor ``name`` with manifest ``shape``."""
    if len(shape) != 2:
        raise ValueError(f"tensor {name}: a quantised tensor is a matrix, not shape {list(shape)}")
    return (shape[0], shape[1]) if name in ROW_MAJOR_TENSORS else (shape[1], shape[0])


def quantised_nbytes(dtype: str, rows: int, cols: int) -> int:
    return rows * (cols // BLOCK_WEIGHTS) * BLOCK_BYTES[dtype]


def _dequant_blocks(dtype: str, blocks: np.ndarray) -> np.ndarray:
    """``blocks uint8 [..., nblocks, block_bytes]`` -> float32 ``[..., nblocks, 32]``."""
    d = blocks[..., 0:2].copy().view("<f2").astype(np.float32)
    if dtype == "q8_0":
        return blocks[..., 2:].copy().view(np.int8).astype(np.float32) * d
    qs = blocks[..., 4:] if dtype == "q4_1" else blocks[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
    if dtype == "q4_0":
        return (q - 8.0) * d
    m = blocks[..., 2:4].copy().view("<f2").astype(np.float32)
    return q * d + m


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """One quantised tensor: ``data`` uint8 ``[rows, cols / 32 * block_bytes]``, manifest ``shape``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        if self.dtype not in BLOCK_BYTES:
            raise ValueError(f"tensor {self.name}: dtype {self.dtype!r} is not one of {', '.join(QUANT_DTYPES)}")
        rows, cols = stored_rows(self.name, self.shape)
        if cols % BLOCK_WEIGHTS:
            raise ValueError(
                f"tensor {self.name}: {cols} weights a row is not a multiple of the {BLOCK_WEIGHTS}-weight block"
            )
        want = (rows, cols // BLOCK_WEIGHTS * BLOCK_BYTES[self.dtype])
        if self.data.dtype != np.uint8 or self.data.shape != want:
            raise ValueError(f"tensor {self.name}: {self.dtype} data {self.data.shape}, expected uint8 {want}")

    @property
    def rows(self) -> int:
        return stored_rows(self.name, self.shape)[0]

    @property
    def cols(self) -> int:
        return stored_rows(self.name, self.shape)[1]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize_rows(self) -> np.ndarray:
        """float32 ``[rows, cols]``: the stored matrix, dequantised (not transposed back)."""
        blocks = np.ascontiguousarray(self.data).reshape(self.rows, -1, BLOCK_BYTES[self.dtype])
        return _dequant_blocks(self.dtype, blocks).reshape(self.rows, self.cols)

    def dequantize(self) -> np.ndarray:
        """float32 in the manifest shape."""
        m = self.dequantize_rows()
        return m if self.name in ROW_MAJOR_TENSORS else np.ascontiguousarray(m.T)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        arr = self.dequantize()
        return arr if dtype is None else arr.astype(np.dtype(dtype), copy=False)  # type: ignore[call-overload]

    def take_rows(self, order: np.ndarray) -> QuantTensor:
        """The same tensor with its stored rows reordered (e.g. undoing a row permutation)."""
        return QuantTensor(self.name, self.dtype, self.shape, np.ascontiguousarray(self.data[order]))


def quantize(name: str, dtype: str, arr: np.ndarray) -> QuantTensor:
    """Round a float matrix (manifest shape) to ``dtype`` blocks the way GGML's reference quantisers do.

    For tests and for writing small quantised fixtures; imports keep the checkpoint's own blocks.
    """
    rows, cols = stored_rows(name, tuple(arr.shape))
    if cols % BLOCK_WEIGHTS:
        raise ValueError(f"tensor {name}: {cols} weights a row is not a multiple of the {BLOCK_WEIGHTS}-weight block")
    m = np.asarray(arr, dtype=np.float32)
    m = m if name in ROW_MAJOR_TENSORS else m.T
    x = np.ascontiguousarray(m).reshape(rows, cols // BLOCK_WEIGHTS, BLOCK_WEIGHTS)
    if dtype == "q8_0":
        amax = np.abs(x).max(axis=-1, keepdims=True)
        d = amax / 127.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.round(x * inv).astype(np.int8)
        head = d.astype("<f2").view(np.uint8).reshape(rows, -1, 2)
        body = q.view(np.uint8)
    elif dtype == "q4_0":
        idx = np.abs(x).argmax(axis=-1)[..., None]
        mx = np.take_along_axis(x, idx, axis=-1)
        d = mx / -8.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.floor(x * inv + 8.5), 0, 15).astype(np.uint8)
        head = d.astype("<f2").view(np.uint8).reshape(rows, -1, 2)
        body = q[..., :16] | (q[..., 16:] << 4)
    elif dtype == "q4_1":
        lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
        d = (hi - lo) / 15.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.floor((x - lo) * inv + 0.5), 0, 15).astype(np.uint8)
        head = np.concatenate(
            [d.astype("<f2").view(np.uint8).reshape(rows, -1, 2), lo.astype("<f2").view(np.uint8).reshape(rows, -1, 2)],
            axis=-1,
        )
        body = q[..., :16] | (q[..., 16:] << 4)
    else:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(QUANT_DTYPES)}")
    data = np.concatenate([head, body], axis=-1).reshape(rows, -1)
    return QuantTensor(name, dtype, tuple(arr.shape), np.ascontiguousarray(data, dtype=np.uint8))
