"""GOLD010: every floating-point weight a package ships is a finite number.

A NaN or an infinity in a parameter blob survives hashing and signing: the package validated PASS and
``run-golden``/``serve`` failed later, at the golden comparison, with a numpy RuntimeWarning on the terminal
(issue 54). The check looks at the bit patterns (an all-ones exponent is NaN or infinity), so nothing is converted
and no floating-point warning can be raised; blobs are read in bounded chunks, the same bytes HASH001 verified.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from calctl.package.model import QUANT_BLOCKS, ParamTensor
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import ValidationContext

#: dtype -> (unsigned view, exponent mask): a value whose exponent bits are all set is NaN or +-inf.
_EXPONENT: dict[str, tuple[str, int]] = {
    "fp32": ("<u4", 0x7F800000),
    "float32": ("<u4", 0x7F800000),
    "fp16": ("<u2", 0x7C00),
    "float16": ("<u2", 0x7C00),
    "bf16": ("<u2", 0x7F80),
    "bfloat16": ("<u2", 0x7F80),
}
#: Quantised blocks: the byte offsets of each block's fp16 scale(s) (ggml's block_q4_0 d, block_q4_1 d and m,
#: block_q8_0 d); the packed integers cannot be non-finite.
_BLOCK_SCALES: dict[str, tuple[int, ...]] = {"q4_0": (0,), "q4_1": (0, 2), "q8_0": (0,)}
#: Bytes read at a time: memory stays flat for multi-GiB blobs.
CHUNK_BYTES = 16 * 1024 * 1024


class WeightsFinite(PackageRule):
    """Every floating-point weight is finite: no NaN or infinity in a parameter tensor (or a quantised block's scale).

    A non-finite weight makes every output it touches NaN: the model runs, the golden comparison fails much later (in
    run-golden or at serve start-up), and nothing says which tensor is broken. So the float tensors (fp32, fp16, bf16)
    and the fp16 scales of Q4_0/Q4_1/Q8_0 blocks are read from their verified files in bounded chunks and their bit
    patterns checked (no conversion, so no floating-point warning); the first non-finite value of each tensor is
    named by tensor, element index and value. Tensors GOLD005 cannot place in their file are skipped with the reason.
    """

    id = "GOLD010"
    sections = ("001 §6.1", "001 §6.2 item 6", "001 §16 PR1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            for i, t in enumerate(m.params):
                if t.dtype not in _EXPONENT and t.dtype not in _BLOCK_SCALES:
                    continue  # integer tensors hold no NaN
                where = f"{m.pointer}/params/tensors/{i}"
                gate = ctx.content_gate(t.file)
                if gate:
                    yield self.skip(f"{t.name} of {m.alias!r} not read: {gate}", file=t.file, field=where)
                    continue
                assert ctx.root is not None
                found, reason = first_non_finite(ctx.root / t.file, t)
                if reason:
                    yield self.skip(f"{t.name} of {m.alias!r} not read: {reason}", file=t.file, field=where)
                    continue
                n += 1
                if found is not None:
                    index, value, count = found
                    yield self.problem(
                        f"tensor {t.name} of {m.alias!r} holds {count:,} non-finite value(s); the first is element "
                        f"{index:,} = {value}",
                        file=t.file,
                        field=where,
                        expected="finite numbers (no NaN, no +-inf)",
                        found=value,
                    )
        yield self.note(f"{n} floating-point tensors hold finite values only")


def first_non_finite(path: Path, t: ParamTensor) -> tuple[tuple[int, str, int] | None, str]:
    """``((index, value, count), "")`` for the first non-finite value of ``t`` in ``path`` (element index, or
    block index for quantised tensors), ``(None, "")`` when all are finite, ``(None, reason)`` when unreadable."""
    block = QUANT_BLOCKS.get(t.dtype)
    unit = block[1] if block else np.dtype(_EXPONENT[t.dtype][0]).itemsize
    step = max(unit, CHUNK_BYTES // unit * unit)
    first: tuple[int, str] | None = None
    count = done = 0
    try:
        with path.open("rb") as fh:
            if t.offset < 0 or t.offset + t.nbytes > os.fstat(fh.fileno()).st_size:
                return None, "it does not lie inside its file (GOLD005)"
            fh.seek(t.offset)
            while done < t.nbytes:
                raw = fh.read(min(step, t.nbytes - done))
                if len(raw) % unit or not raw:
                    return None, "it runs past the end of its file (GOLD005)"
                bad, values = _bad_in(raw, t.dtype)
                if bad.size:
                    count += int(bad.size)
                    if first is None:
                        first = (done // unit + int(bad[0]), values(int(bad[0])))
                done += len(raw)
    except OSError as exc:
        return None, f"cannot read it ({exc.strerror or exc})"
    return ((first[0], first[1], count) if first else None), ""


def _bad_in(raw: bytes, dtype: str) -> tuple[np.ndarray, Callable[[int], str]]:
    """Indices (elements, or blocks) whose bits are non-finite, and a function naming the value at one of them."""
    if dtype in _BLOCK_SCALES:
        size = QUANT_BLOCKS[dtype][1]
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, size)
        bad_rows = np.zeros(blocks.shape[0], dtype=bool)
        for at in _BLOCK_SCALES[dtype]:
            scale = blocks[:, at : at + 2].copy().view("<u2").reshape(-1)
            bad_rows |= (scale & 0x7C00) == 0x7C00
        idx = np.flatnonzero(bad_rows)

        def block_value(k: int) -> str:
            scales = [float(blocks[k, a : a + 2].copy().view("<f2")[0]) for a in _BLOCK_SCALES[dtype]]
            return f"block scale(s) {', '.join(repr(s) for s in scales)}"

        return idx, block_value
    view, mask = _EXPONENT[dtype]
    bits = np.frombuffer(raw, dtype=view)
    idx = np.flatnonzero((bits & mask) == mask)

    def value(k: int) -> str:
        b = int(bits[k])
        if dtype in ("bf16", "bfloat16"):
            return repr(float(np.array([b << 16], dtype="<u4").view("<f4")[0]))
        return repr(float(bits[k : k + 1].view("<f4" if view == "<u4" else "<f2")[0]))

    return idx, value


RULES: tuple[type[Rule], ...] = (WeightsFinite,)
