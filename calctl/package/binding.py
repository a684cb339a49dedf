"""The binding note: how a program file says which slot it was compiled for.

Every ELF program in a package carries one ``PT_NOTE`` named ``Calculet`` of
type ``NT_CALCULET_BINDING`` whose text is ``graph=…;chip=…;calcore=…``. This is
part of the package contract: the compiler writes it (``calctl.compiler``), the
validator reads it (``calctl.package.rules.elf``). Nothing here reads files.
"""

from __future__ import annotations

NOTE_NAME = b"Calculet"
NT_CALCULET_BINDING = 1


def parse_binding(desc: bytes | str) -> dict[str, str]:
    """The ``key=value`` pairs of a binding note's text (unknown keys kept, malformed parts ignored)."""
    text = desc.decode("ascii", "replace") if isinstance(desc, bytes) else desc
    out: dict[str, str] = {}
    for part in text.rstrip("\0").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


__all__ = ["NOTE_NAME", "NT_CALCULET_BINDING", "parse_binding"]
