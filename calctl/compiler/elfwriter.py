"""A small ELF64 writer for the programs in sample packages (the mock compiler).

Each program is an ``ET_EXEC`` image with one ``PT_LOAD`` (R+X) at the address
the manifest assigns and one ``PT_NOTE`` carrying the binding
``graph=…;chip=…;calcore=…`` so the validator can check that file name,
manifest and target agree. Section headers (.text, .note.calculet, .shstrtab)
are included so binutils shows a normal image.

This writes bytes only; reading and checking ELFs is the validator's job
(pyelftools).
"""

from __future__ import annotations

import struct

from calctl.package.binding import NOTE_NAME, NT_CALCULET_BINDING
from calctl.package.elfdefs import (
    ELFCLASS64,
    ELFDATA2LSB,
    ET_EXEC,
    PF_R,
    PF_X,
    PT_LOAD,
    PT_NOTE,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHT_NOTE,
    SHT_PROGBITS,
    SHT_STRTAB,
)

EHDR_SIZE, PHDR_SIZE, SHDR_SIZE = 64, 56, 64


def _pad(b: bytes, align: int) -> bytes:
    return b + b"\0" * (-len(b) % align)


def note_payload(binding: str) -> bytes:
    name = NOTE_NAME + b"\0"
    desc = binding.encode("ascii")
    return struct.pack("<III", len(name), len(desc), NT_CALCULET_BINDING) + _pad(name, 4) + _pad(desc, 4)


def write_elf(*, machine: int, vaddr: int, text: bytes, binding: str, bss: int = 0) -> bytes:
    """Return the bytes of an ELF64 little-endian executable.

    ``text`` is loaded at ``vaddr`` (also the entry point); ``bss`` extra bytes of
    zero-initialised memory extend the segment (memsz > filesz).
    """
    note = note_payload(binding)
    shstr = b"\0.text\0.note.calculet\0.shstrtab\0"
    phnum, shnum = 2, 4
    ph_off = EHDR_SIZE
    note_off = ph_off + phnum * PHDR_SIZE
    text_off = note_off + len(note)
    text_off += -text_off % 16
    shstr_off = text_off + len(text)
    sh_off = shstr_off + len(shstr)
    sh_off += -sh_off % 8

    ident = b"\x7fELF" + bytes([ELFCLASS64, ELFDATA2LSB, 1, 0]) + b"\0" * 8
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        ET_EXEC,
        machine,
        1,
        vaddr,
        ph_off,
        sh_off,
        0,
        EHDR_SIZE,
        PHDR_SIZE,
        phnum,
        SHDR_SIZE,
        shnum,
        3,
    )
    load = struct.pack("<IIQQQQQQ", PT_LOAD, PF_R | PF_X, text_off, vaddr, vaddr, len(text), len(text) + bss, 16)
    pnote = struct.pack("<IIQQQQQQ", PT_NOTE, PF_R, note_off, 0, 0, len(note), len(note), 4)
    out = bytearray(ehdr + load + pnote + note)
    out += b"\0" * (text_off - len(out))
    out += text + shstr
    out += b"\0" * (sh_off - len(out))
    null = b"\0" * SHDR_SIZE
    s_text = struct.pack(
        "<IIQQQQIIQQ", 1, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, vaddr, text_off, len(text), 0, 0, 16, 0
    )
    s_note = struct.pack("<IIQQQQIIQQ", 7, SHT_NOTE, 0, 0, note_off, len(note), 0, 0, 4, 0)
    s_str = struct.pack("<IIQQQQIIQQ", 22, SHT_STRTAB, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0)
    out += null + s_text + s_note + s_str
    return bytes(out)
