"""The ELF numbers calctl both writes (:mod:`calctl.compiler.elfwriter`) and checks (the ELF rules).

Values of the ELF specification (System V gABI), named as there; only those calctl uses.
"""

from __future__ import annotations

ELFCLASS64 = 2
ELFDATA2LSB = 1
ET_EXEC = 2
PT_LOAD = 1
PT_NOTE = 4
PN_XNUM = 0xFFFF
PF_X, PF_W, PF_R = 1, 2, 4
SHT_PROGBITS, SHT_STRTAB, SHT_NOTE, SHT_NOBITS = 1, 3, 7, 8
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
