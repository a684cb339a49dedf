"""How a program or command file says which slot it was compiled for.

A slot is one (model, graph, chip, CalCore). Two file formats carry their slot:

* every ELF program carries one ``PT_NOTE`` named ``Calculet`` of type
  ``NT_CALCULET_BINDING`` whose text is ``graph=…;kind=…;chip=…;calcore=…``;
* every command blob starts with an 80-byte header: the magic ``CALCMD01``,
  the chip and the CalCore as little-endian u32, and the graph name NUL-padded
  to 64 bytes; the command stream itself follows and is never empty.

This is part of the package contract: the compiler writes these
(``calctl.compiler``), the validator reads them (``calctl.package.rules``).
Nothing here reads files.
"""

from __future__ import annotations

from dataclasses import dataclass

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


CMD_MAGIC = b"CALCMD01"
CMD_GRAPH_BYTES = 64
CMD_HEADER_BYTES = len(CMD_MAGIC) + 4 + 4 + CMD_GRAPH_BYTES


@dataclass(frozen=True)
class CommandHeader:
    chip: int
    calcore: int
    graph: str


def parse_command_header(head: bytes) -> CommandHeader | str:
    """The slot a command blob's first :data:`CMD_HEADER_BYTES` bytes name, or why they name none."""
    if len(head) < CMD_HEADER_BYTES:
        return f"{len(head)} bytes, shorter than the {CMD_HEADER_BYTES}-byte command header"
    if head[: len(CMD_MAGIC)] != CMD_MAGIC:
        return f"does not start with the command magic {CMD_MAGIC.decode()!r} (found {head[:8]!r})"
    o = len(CMD_MAGIC)
    chip = int.from_bytes(head[o : o + 4], "little")
    calcore = int.from_bytes(head[o + 4 : o + 8], "little")
    raw = head[o + 8 : CMD_HEADER_BYTES]
    name, _, pad = raw.partition(b"\0")
    if pad.strip(b"\0"):
        return "the graph name field holds bytes after its NUL terminator"
    try:
        graph = name.decode("ascii")
    except UnicodeDecodeError:
        return "the graph name field is not ASCII"
    return CommandHeader(chip=chip, calcore=calcore, graph=graph)


def command_header(graph: str, chip: int, calcore: int) -> bytes:
    """The header :func:`parse_command_header` reads (what the compiler writes)."""
    return CMD_MAGIC + chip.to_bytes(4, "little") + calcore.to_bytes(4, "little") + graph.encode().ljust(64, b"\0")


__all__ = [
    "CMD_HEADER_BYTES",
    "CMD_MAGIC",
    "NOTE_NAME",
    "NT_CALCULET_BINDING",
    "CommandHeader",
    "command_header",
    "parse_binding",
    "parse_command_header",
]
