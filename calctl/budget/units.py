"""Sizes and element widths for the capacity budget (001 §8.1).

``parse_size`` turns ``16GiB``, ``512MiB``, ``1.5GB`` or ``4096`` into bytes and
names the option or field in every error. ``DTYPE_BITS`` gives the storage width
of each element type the budget knows, in bits, so ``int4`` (half a byte) stays
exact integer arithmetic. ``gib`` and ``percent`` render figures for tables.

This module knows nothing about packages, configs or the GO/NO-GO policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

from calctl.errors import UsageError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

#: Binary units (KiB = 1024 B) and decimal units (KB = 1000 B). A bare ``G``/``M``
#: is refused: it is the one spelling that means different things to different tools.
_UNITS: Mapping[str, int] = {
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "pib": 1024**5,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
}
_SIZE_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")

#: Nothing calctl budgets is larger than this; a bigger figure is a typo.
MAX_SIZE_BYTES = 1024**5  # 1 PiB

#: Storage width in bits. Canonical names first; HF ``torch_dtype`` spellings map onto them.
DTYPE_BITS: Mapping[str, int] = {
    "fp32": 32,
    "bf16": 16,
    "fp16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
    "uint8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
    # GGML blocks of 32 weights (4.5, 5 and 8.5 bits a weight), rounded up to whole bits: a budget errs high.
    "q4_0": 5,
    "q4_1": 5,
    "q8_0": 9,
}
_DTYPE_ALIASES: Mapping[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}
#: What ``--dtype`` and ``--kv-dtype`` accept (docs/budget.md; fp32 for the mock packages).
OPTION_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4", "fp32")


def parse_size(text: str, what: str, *, allow_zero: bool = True) -> int:
    """Bytes from ``text``: a plain integer, or a number with KiB/MiB/GiB/TiB or KB/MB/GB/TB.

    Fractions of a byte are dropped (``0.1GiB`` is 107374182 bytes). ``what`` names
    the option or field in the error, e.g. ``--chip-dram``.
    """
    raw = str(text)
    if raw.strip().startswith("-"):
        raise UsageError(f"{what} {raw!r}: a size cannot be negative")
    m = _SIZE_RE.match(raw)
    if not m:
        raise UsageError(
            f"{what} {raw!r}: not a size",
            hint="write bytes (4096), binary units (512MiB, 16GiB) or decimal units (1.5GB)",
        )
    unit = m.group("unit").lower() or "b"
    if unit not in _UNITS:
        raise UsageError(
            f"{what} {raw!r}: unknown unit {m.group('unit')!r}",
            hint="units: B, KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB (1000-based)",
        )
    try:
        value = int(Decimal(m.group("num")) * _UNITS[unit])
    except InvalidOperation:  # pragma: no cover - the regex admits only decimal digits
        raise UsageError(f"{what} {raw!r}: not a number") from None
    if value == 0 and not allow_zero:
        raise UsageError(f"{what} {raw!r}: must be larger than zero")
    if value > MAX_SIZE_BYTES:
        raise UsageError(f"{what} {raw!r}: {value} bytes is more than 1 PiB; that is not a real chip budget")
    return value


def canonical_dtype(name: str, what: str, allowed: tuple[str, ...] | None = None) -> str:
    """The canonical spelling of a dtype (``bfloat16`` -> ``bf16``); raise naming ``what``."""
    key = str(name).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    choices = allowed if allowed is not None else tuple(DTYPE_BITS)
    if key not in DTYPE_BITS or key not in choices:
        raise UsageError(f"{what} {name!r}: unknown dtype", hint=f"one of: {', '.join(choices)}")
    return key


def bits_to_bytes(bits: int) -> int:
    """Whole bytes holding ``bits`` (rounded up: a half-filled byte is still stored)."""
    return -(-bits // 8)


def gib(n: int) -> str:
    """``n`` bytes as GiB with three decimals, the unit the reports use (001 §3)."""
    return f"{n / GIB:.3f}"


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def fraction(value: float) -> str:
    """A policy fraction as a percentage without false precision: 0.8 -> ``80%``, 0.775 -> ``77.5%``."""
    return f"{value * 100:.10g}%"


def human(n: int) -> str:
    """A short binary-unit rendering for prose (``1 GiB``, ``96 MiB``, ``2.400 GiB``)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            q = n / size
            return f"{q:.0f} {unit}" if n % size == 0 else f"{q:.3f} {unit}"
    return f"{n} B"
