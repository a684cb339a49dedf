"""ELF rules (ELF): the chip-local CalCore programs, read with pyelftools.

Only programs whose SHA-256 matched checksums.sha256 are parsed (HASH001); a
program that does not parse (ELF001) is skipped by the other ELF rules with
that reason. Which programs must exist is CHIP006; where the code region is
is MEM.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, ClassVar

from calctl.package import binding
from calctl.package.elfdefs import PF_R, PF_W, PF_X, PT_LOAD, SHN_LORESERVE, SHN_UNDEF, SHT_NOBITS, SHT_STRTAB
from calctl.package.model import Graph, Model, Section, SectionKind
from calctl.package.rules.base import Finding, Need, PackageRule, Rule
from calctl.package.rules.context import MAX_PROGRAM_HEADERS, MAX_SECTION_HEADERS, ElfInfo, ValidationContext

U64 = 1 << 64


@dataclass(frozen=True)
class Program:
    model: Model
    graph: Graph
    section: Section
    file: str
    info: ElfInfo | None
    skip: str | None  # why it is not checked (hash failed, does not parse)


def programs(ctx: ValidationContext, *, need_parsed: bool = True) -> Iterator[Program]:
    """Each code section's ELF once, with its parsed values or the reason it is skipped."""
    pkg = ctx.pkg
    seen: set[str] = set()
    for m in pkg.models:
        for g in m.graphs:
            for s in g.code_sections:
                if s.file is None or s.file in seen:
                    continue  # no file / shared file: CHIP006
                seen.add(s.file)
                reason = ctx.content_gate(s.file)
                if reason:
                    yield Program(m, g, s, s.file, None, f"ELF checks skipped: {reason}")
                    continue
                parsed = ctx.elf(s.file)
                if isinstance(parsed, str):
                    yield Program(
                        m, g, s, s.file, None, None if not need_parsed else "skipped: ELF001 failed for this file"
                    )
                    continue
                yield Program(m, g, s, s.file, parsed, None)


def _header_table_problems(info: ElfInfo) -> Iterator[tuple[str, str, Any, Any]]:
    """What readelf would report about the header tables: (message, field, expected, found)."""
    h = info.headers
    size = info.file_size
    ph_ent, sh_ent = (56, 64) if info.elf_class == "ELF64" else (32, 40)
    if h.phnum and h.phentsize != ph_ent:
        yield "program header entry size is not that of the ELF class", "/e_phentsize", ph_ent, h.phentsize
    if h.phnum > MAX_PROGRAM_HEADERS:
        yield "too many program headers (none were read)", "/e_phnum", f"<= {MAX_PROGRAM_HEADERS}", h.phnum
    elif h.phoff + h.phnum * h.phentsize > size:
        yield (
            "program header table runs past the end of the file (none were read)",
            "/e_phoff",
            f"table end <= {size}",
            f"{h.phoff} + {h.phnum} x {h.phentsize}",
        )
    if h.shnum == 0 and h.shoff == 0:
        if h.shstrndx != SHN_UNDEF:
            yield "e_shstrndx names a section but there is no section header table", "/e_shstrndx", 0, h.shstrndx
        return
    if h.shentsize != sh_ent:
        yield "section header entry size is not that of the ELF class", "/e_shentsize", sh_ent, h.shentsize
        return
    end = h.shoff + h.shnum * h.shentsize
    if h.shoff > size or end > size:
        yield "section header table runs past the end of the file", "/e_shoff", f"end <= {size}", f"end {end}"
        return
    if h.shnum == 0:
        yield (
            "e_shoff is set but e_shnum is 0 (extended numbering is not used by CalCore programs)",
            "/e_shnum",
            ">= 1",
            0,
        )
        return
    if h.shnum > MAX_SECTION_HEADERS:
        yield "too many section headers", "/e_shnum", f"<= {MAX_SECTION_HEADERS}", h.shnum
        return
    if h.shstrndx != SHN_UNDEF:
        if h.shstrndx >= h.shnum or h.shstrndx >= SHN_LORESERVE:
            yield "e_shstrndx is out of range of the section header table", "/e_shstrndx", f"< {h.shnum}", h.shstrndx
        elif h.sections and h.sections[h.shstrndx].type != SHT_STRTAB:
            yield (
                "e_shstrndx does not name a string table",
                f"/sections/{h.shstrndx}/sh_type",
                "SHT_STRTAB",
                (h.sections[h.shstrndx].type),
            )
    for sec in h.sections:
        if sec.type != SHT_NOBITS and sec.offset + sec.size > size:
            yield (
                f"section {sec.index}'s bytes run past the end of the file",
                f"/sections/{sec.index}",
                f"offset+size <= {size}",
                sec.offset + sec.size,
            )


class ProgramRule(PackageRule):
    """An ELF rule that judges each parsed program once; a program it cannot judge is a skip with the reason."""

    #: The pass note, with ``{n}`` the number of programs judged.
    passed: ClassVar[str] = "{n} programs checked"

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for p in programs(ctx):
            if p.info is None:
                yield self.skip(str(p.skip), file=p.file)
                continue
            n += 1
            yield from self.check_program(ctx, p, p.info)
        yield self.note(self.passed_note(ctx, n))

    def check_program(self, ctx: ValidationContext, p: Program, info: ElfInfo) -> Iterator[Finding]:
        raise NotImplementedError  # pragma: no cover - abstract

    def passed_note(self, ctx: ValidationContext, n: int) -> str:
        return self.passed.format(n=n)


class ElfParses(PackageRule):
    """Each ELF program parses with pyelftools as an executable with at least one PT_LOAD segment.

    Phase 1 of bring-up starts with static checks of SCHIP, masks, ELF, commands, parameters, KV, addresses and hashes
    (001 §12). Every chip-local ccu ELF must parse with pyelftools, be ET_EXEC and have a loadable segment. Its header
    tables must be what readelf accepts: the program and section header tables lie inside the file with the entry size
    of the ELF class, e_shstrndx names an existing SHT_STRTAB section (or is SHN_UNDEF), and every section's bytes (but
    SHT_NOBITS) lie inside the file. Parse errors are reported with pyelftools' message; the other ELF rules then skip
    that file.
    """

    id = "ELF001"
    sections = ("001 §6.1", "001 §12 Phase 1 item 1", "001 §15.1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for p in programs(ctx, need_parsed=False):
            if p.skip:
                yield self.skip(p.skip, file=p.file)
                continue
            n += 1
            if p.info is None:
                yield self.problem(f"does not parse as ELF: {ctx.elf(p.file)}", file=p.file)
                continue
            if p.info.e_type != "ET_EXEC":
                yield self.problem(
                    "is not an executable image", file=p.file, field="/e_type", expected="ET_EXEC", found=p.info.e_type
                )
            if not any(seg.type == PT_LOAD for seg in p.info.segments):
                yield self.problem("has no PT_LOAD segment", file=p.file, field="/program_headers")
            for message, field, expected, found in _header_table_problems(p.info):
                yield self.problem(message, file=p.file, field=field, expected=expected, found=found)
        yield self.note(f"{n} ELF programs parse")


class ElfMachine(ProgramRule):
    """ELF class, byte order and machine are those compatibility.json declares.

    compatibility.json (the compatibility matrix of 001 §15.1 item 5) states the ELF class, data encoding and e_machine
    the CalCores execute. A program built for another machine or byte order would be loaded into CalCore memory and
    fault or run garbage.
    """

    id = "ELF002"
    needs = frozenset({Need.ROOT, Need.MANIFEST, Need.COMPATIBILITY})
    sections = ("001 §15.1 item 5", "001 §15.2 item 10")

    @staticmethod
    def wanted(ctx: ValidationContext) -> dict[str, Any]:
        """The "elf" object of compatibility.json (COMP001 validated it)."""
        doc = ctx.compatibility.doc
        assert doc is not None
        return dict(doc["elf"])

    def passed_note(self, ctx: ValidationContext, n: int) -> str:
        want = self.wanted(ctx)
        return f"{n} programs are {want['class']} {want['data']}-endian machine {want['machine']}"

    def check_program(self, ctx: ValidationContext, p: Program, info: ElfInfo) -> Iterator[Finding]:
        want = self.wanted(ctx)
        if info.elf_class != want["class"]:
            yield self.problem(
                "wrong ELF class",
                file=p.file,
                field="/e_ident/EI_CLASS",
                expected=want["class"],
                found=info.elf_class,
            )
        if info.data != want["data"]:
            yield self.problem(
                "wrong byte order", file=p.file, field="/e_ident/EI_DATA", expected=want["data"], found=info.data
            )
        if info.machine != want["machine"]:
            yield self.problem(
                "wrong machine",
                file=p.file,
                field="/e_machine",
                expected=f"{want['machine']} ({want.get('machine_name', '?')})",
                found=f"{info.machine} ({info.machine_name})",
            )


class EntryInLoadSegment(ProgramRule):
    """The entry point lies inside the file bytes of an executable PT_LOAD segment (not its bss tail).

    A CalCore starts at e_entry; an entry point outside every loaded, executable segment jumps into unmapped or data
    memory, and one in a segment's zero-filled tail [p_vaddr+p_filesz, p_vaddr+p_memsz) (its bss) executes zeros: it
    must lie in the segment's file bytes.
    """

    id = "ELF003"
    sections = ("001 §6.1", "001 §12 Phase 1 item 1")
    passed = "{n} entry points inside executable PT_LOAD segments"

    def check_program(self, ctx: ValidationContext, p: Program, info: ElfInfo) -> Iterator[Finding]:
        e = info.entry
        loads = [s for s in info.segments if s.type == PT_LOAD]
        inside = [s for s in loads if s.vaddr <= e < s.vaddr + s.memsz]
        if not inside:
            yield self.problem(
                "entry point is outside every PT_LOAD segment",
                file=p.file,
                field="/e_entry",
                expected=", ".join(f"[0x{s.vaddr:x}, 0x{s.vaddr + s.memsz:x})" for s in loads) or "a PT_LOAD",
                found=f"0x{e:x}",
            )
        elif not any(s.flags & PF_X for s in inside):
            yield self.problem(
                "entry point lies in a non-executable segment", file=p.file, field="/e_entry", found=f"0x{e:x}"
            )
        elif not any(s.flags & PF_X and s.vaddr <= e < s.vaddr + s.filesz for s in inside):
            yield self.problem(
                "entry point lies in the zero-filled tail (bss) of its segment, past the file bytes",
                file=p.file,
                field="/e_entry",
                expected=", ".join(f"[0x{s.vaddr:x}, 0x{s.vaddr + s.filesz:x})" for s in inside if s.flags & PF_X),
                found=f"0x{e:x}",
            )


class LoadSegmentPlacement(ProgramRule):
    """PT_LOAD segments fit the file, do not overlap, and lie in the manifest section and the chip's code region.

    Each PT_LOAD's file bytes lie inside the file; loaded segments do not overlap each other; every segment [p_vaddr,
    p_vaddr+p_memsz) lies inside the manifest code section [vaddr, vaddr+size) that names this ELF and inside the code
    region the memory plan gives the model on that chip. Otherwise loading the program overwrites another program, the
    command stream or another model's memory (001 §6.2 item 1: addresses must be unambiguous).
    """

    id = "ELF004"
    sections = ("001 §6.2 item 1", "001 §6.1", "001 §15.1 item 7")
    passed = "{n} programs load inside their sections and code regions"

    def check_program(self, ctx: ValidationContext, p: Program, info: ElfInfo) -> Iterator[Finding]:
        loads = [s for s in info.segments if s.type == PT_LOAD]
        for seg in loads:
            where = f"/program_headers/{seg.index}"
            end = seg.vaddr + seg.memsz
            if seg.offset + seg.filesz > info.file_size:
                yield self.problem(
                    "segment bytes run past the end of the file",
                    file=p.file,
                    field=where,
                    expected=f"offset+filesz <= {info.file_size}",
                    found=seg.offset + seg.filesz,
                )
            if end > U64:
                yield self.problem("segment wraps the 64-bit address space", file=p.file, field=where)
                continue
            s = p.section
            if not (s.vaddr <= seg.vaddr and end <= s.end):
                yield self.problem(
                    f"segment is outside its manifest section {s.name}",
                    file=p.file,
                    field=where,
                    expected=f"within [0x{s.vaddr:x}, 0x{s.end:x})",
                    found=f"[0x{seg.vaddr:x}, 0x{end:x})",
                )
            for chip in s.chips:
                if chip not in p.model.target_chips:
                    continue  # a section on a foreign chip is CHIP003/CHIP004
                regions = [
                    r for r in ctx.pkg.regions_on(chip) if r.owner == p.model.alias and r.kind is SectionKind.CODE
                ]
                if not regions:
                    yield self.skip(
                        f"no code region of {p.model.alias!r} on chip {chip} to check against (MEM004)",
                        file=p.file,
                        field=where,
                    )
                elif not any(r.vaddr <= seg.vaddr and end <= r.end for r in regions):
                    yield self.problem(
                        f"segment is outside the code region of {p.model.alias!r} on chip {chip}",
                        file=p.file,
                        field=where,
                        expected=" or ".join(f"[0x{r.vaddr:x}, 0x{r.end:x})" for r in regions),
                        found=f"[0x{seg.vaddr:x}, 0x{end:x})",
                    )
        ordered = sorted(loads, key=lambda x: x.vaddr)
        for a, b in itertools.pairwise(ordered):
            if b.vaddr < a.vaddr + a.memsz:
                yield self.problem(
                    f"PT_LOAD segments {a.index} and {b.index} overlap",
                    file=p.file,
                    field=f"/program_headers/{b.index}",
                )


class SegmentFlags(ProgramRule):
    """Every segment has filesz <= memsz, and none is both writable and executable (W^X).

    p_filesz > p_memsz would copy file bytes past the segment's memory; a segment both writable and executable lets a
    data fault become code execution on the CalCore, and since the fault scope of a chip may be the whole board (001
    §11.3) this is refused outright (W^X).
    """

    id = "ELF005"
    sections = ("001 §6.1", "001 §11.3")
    passed = "{n} programs: filesz <= memsz and W^X hold"

    def check_program(self, ctx: ValidationContext, p: Program, info: ElfInfo) -> Iterator[Finding]:
        for seg in info.segments:
            where = f"/program_headers/{seg.index}"
            if seg.type == PT_LOAD and seg.filesz > seg.memsz:
                yield self.problem(
                    "p_filesz exceeds p_memsz",
                    file=p.file,
                    field=where,
                    expected=f"<= {seg.memsz}",
                    found=seg.filesz,
                )
            if seg.flags & PF_W and seg.flags & PF_X:
                yield self.problem(
                    "segment is both writable and executable (W^X)",
                    file=p.file,
                    field=f"{where}/p_flags",
                    expected="not W and X together",
                    found=_flags(seg.flags),
                )


def _flags(flags: int) -> str:
    return ("R" if flags & PF_R else "-") + ("W" if flags & PF_W else "-") + ("X" if flags & PF_X else "-")


class BindingNote(ProgramRule):
    """The PT_NOTE binding (graph, kind, chip, calcore) agrees with the manifest and the file name.

    Each program carries one PT_NOTE named 'Calculet' (type 1) with 'graph=…;kind=…;chip=…;calcore=…'
    (calctl.package.binding). It must name the graph, graph kind, chip and CalCore of the manifest section that loads
    it, and the file must be <model>/<kind>/ccu<calcore>_chip<chip>.elf (docs/package-format.md). A program moved to
    another graph, chip or core (001 §3 forbids renaming subgraphs or reusing another chip's program) is caught here.
    """

    id = "ELF006"
    sections = ("001 §6.1", "001 §6.4", "001 §3", "docs/package-format.md")
    passed = "{n} programs are bound to their graph, kind, chip and CalCore"

    def check_program(self, ctx: ValidationContext, p: Program, info: ElfInfo) -> Iterator[Finding]:
        s, g = p.section, p.graph
        chip = s.chips[0] if len(s.chips) == 1 else None
        want_name = f"ccu{s.calcore}_chip{chip}.elf"
        path = PurePosixPath(p.file)
        if path.name != want_name:
            yield self.problem(
                "file name does not match its section's CalCore and chip",
                file=p.file,
                field=f"{s.pointer}/file",
                expected=want_name,
                found=path.name,
            )
        if path.parent.name != g.kind.value:
            yield self.problem(
                "program is not in its graph kind's directory",
                file=p.file,
                field=f"{s.pointer}/file",
                expected=f"<model>/{g.kind.value}/{want_name}",
                found=p.file,
            )
        notes = [
            nt for nt in info.notes if nt.name == binding.NOTE_NAME.decode() and nt.type == binding.NT_CALCULET_BINDING
        ]
        if len(notes) != 1:
            yield self.problem(
                "expected exactly one Calculet binding note",
                file=p.file,
                field="/notes",
                expected=1,
                found=len(notes),
            )
            return
        bound = binding.parse_binding(notes[0].desc)
        want = {"graph": g.name, "kind": g.kind.value, "chip": str(chip), "calcore": str(s.calcore)}
        for key, value in want.items():
            if bound.get(key) != value:
                yield self.problem(
                    f"binding note {key} disagrees with the manifest",
                    file=p.file,
                    field=f"/notes/binding/{key}",
                    expected=value,
                    found=bound.get(key, "absent"),
                )


RULES: tuple[type[Rule], ...] = (
    ElfParses,
    ElfMachine,
    EntryInLoadSegment,
    LoadSegmentPlacement,
    SegmentFlags,
    BindingNote,
)
