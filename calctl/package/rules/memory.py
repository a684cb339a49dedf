"""Memory-plan rules (MEM): per-chip regions, where sections sit, KV size, the reservation file.

The memory plan in the manifest is the per-chip address map (001 §6.2, §15.1
item 7); ``model_memory_reserved_info.txt`` is its human-readable twin and must
agree with it. Which chips a section may touch is CHIP; capacity headroom
policy (75-80 %, reserve) is ``calctl budget``, not validation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from calctl.package.model import DTYPE_BYTES, MANIFEST, RESERVED_INFO, MemoryRegion, Model, SectionKind
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import ReadProblem, ValidationContext
from calctl.package.rules.layout import RESERVED_INFO_MAX_BYTES

U64 = 1 << 64


def kv_formula_bytes(m: Model) -> int:
    """001 §8.1 / docs/budget.md: ``2 * n_layers * n_kv_heads * head_dim * ceil(context/block)*block * max_sequences * bytes``."""
    a = m.architecture
    blocks = -(-a.context_limit // m.kv.block_tokens)
    return (
        2
        * a.n_layers
        * a.n_kv_heads
        * a.head_dim
        * blocks
        * m.kv.block_tokens
        * m.kv.max_sequences
        * DTYPE_BYTES[m.kv.dtype]
    )


class RegionsDisjoint(PackageRule):
    """On each chip, memory regions do not overlap and stay inside the 64-bit address space.

    The compiler produces one address plan per chip for A and B together (001 §6.2, path A). Numbers may repeat across
    chips (item 1), but on one chip no two regions, of the same or of different models, may overlap: overlapping
    weights, KV or workspace are silent corruption.
    """

    id = "MEM001"
    sections = ("001 §6.2 items 1-3", "001 §15.1 item 7")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        for chip in sorted({r.chip for r in pkg.memory_plan}):
            regions = sorted(pkg.regions_on(chip), key=lambda r: (r.vaddr, r.end))
            for r in regions:
                if r.end > U64:
                    yield self.manifest_problem(f"region {r.name} wraps the 64-bit address space", field=r.pointer)
            for i, a in enumerate(regions):
                for b in regions[i + 1 :]:
                    if b.vaddr >= a.end:
                        break
                    yield self.manifest_problem(
                        f"regions {a.name} ({a.owner}) and {b.name} ({b.owner}) overlap on chip {chip}",
                        field=b.pointer,
                        expected=f"start >= 0x{a.end:x}",
                        found=f"0x{b.vaddr:x}",
                    )
        yield self.note(f"{len(pkg.memory_plan)} regions, disjoint on each chip")


class FitsChipDram(PackageRule):
    """Each chip's reserved regions fit its own local DRAM (device_cfg.chip_dram_bytes).

    Capacity is judged per chip, never as the board total (001 §8.2): the regions reserved on a chip must add up to no
    more than that chip's local DRAM. (The 75-80 % safety line and the reserve are capacity policy, checked by `calctl
    budget`; this rule rejects plans that cannot fit at all.)
    """

    id = "MEM002"
    sections = ("001 §8.1", "001 §8.2", "001 §3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        dram = pkg.device_cfg.chip_dram_bytes
        totals = []
        for chip in sorted({r.chip for r in pkg.memory_plan}):
            total = sum(r.size for r in pkg.regions_on(chip))
            totals.append(f"chip {chip} {total}/{dram}")
            if total > dram:
                yield self.manifest_problem(
                    f"chip {chip} reserves more than its DRAM",
                    field="/memory_plan",
                    expected=f"<= {dram} bytes",
                    found=f"{total} bytes",
                )
        yield self.note("reserved bytes per chip: " + ", ".join(totals))


class PrivateRegions(PackageRule):
    """Every region belongs to one model of the package that runs on that chip: A and B share no writable memory.

    A and B must not share writable state (001 §6.2 item 2); their KV bases, sync units and completion information are
    independent (item 3). Every region's owner is an alias of the package, and that model targets the chip the region is
    on: no 'shared' region, no region of A on B's chip. (A.prefill and A.decode may reuse A's workspace: that is one
    owner.)
    """

    id = "MEM003"
    sections = ("001 §6.2 items 2-3", "001 §4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        models = {m.alias: m for m in pkg.models}
        for r in pkg.memory_plan:
            m = models.get(r.owner)
            kind = "writable " if r.writable else ""
            if m is None:
                yield self.manifest_problem(
                    f"{kind}region {r.name} is owned by {r.owner!r}, which is not a model of the package",
                    field=f"{r.pointer}/owner",
                    expected=sorted(models),
                    found=r.owner,
                )
            elif r.chip not in m.target_chips:
                yield self.manifest_problem(
                    f"{kind}region {r.name} of model {r.owner!r} is on chip {r.chip}, which the model does not target",
                    field=f"{r.pointer}/owner",
                    expected=f"chip in {list(m.target_chips)}",
                    found=r.chip,
                )
        yield self.note("every region is private to a model on its own chip")


class SectionsInRegions(PackageRule):
    """Every section lies inside a region of the same owner and kind on each of its model's chips.

    The memory plan must account for every section: on each chip the section is placed on (and its model targets),
    [vaddr, vaddr+size) lies inside one region with the same owner and the same kind (code in code, KV in KV, ...). A
    section outside every region uses memory nobody reserved. Sections reaching chips their model does not target are
    CHIP003/CHIP004 findings and are not repeated here.
    """

    id = "MEM004"
    sections = ("001 §6.2 items 1-2", "001 §15.1 item 7")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        n = 0
        for m in pkg.models:
            for s in m.all_sections():
                for chip in s.chips:
                    if chip not in m.target_chips:
                        continue
                    n += 1
                    candidates = [r for r in pkg.regions_on(chip) if r.owner == m.alias and r.kind is s.kind]
                    if not any(r.vaddr <= s.vaddr and s.end <= r.end for r in candidates):
                        yield self.manifest_problem(
                            f"section {s.name} ({s.kind.value}) on chip {chip} is "
                            f"not inside a {s.kind.value} region of {m.alias!r}",
                            field=s.pointer,
                            expected=" or ".join(f"[0x{r.vaddr:x}, 0x{r.end:x})" for r in candidates)
                            or f"a {s.kind.value} region",
                            found=f"[0x{s.vaddr:x}, 0x{s.end:x})",
                        )
        yield self.note(f"{n} section placements inside their regions")


class KvSize(PackageRule):
    """The KV size, section and region match the KV formula for the declared context, sequences and dtype.

    KV_bytes = 2 x n_layers x n_kv_heads x head_dim x ceil(context/block) x block x max_sequences x bytes(kv dtype) (001
    §8.1; for the reference Qwen3-30B-A3B BF16 this is 3.750 GiB at 40960 tokens, §3). kv.bytes must equal it for the
    declared context_limit, the kv section must be exactly kv.bytes, and the model's KV region on each chip must hold at
    least kv.bytes. A smaller KV overruns into the next region at long context; a larger one hides a different context
    or batch than declared.
    """

    id = "MEM005"
    sections = ("001 §8.1", "001 §3", "docs/budget.md", "000 §9")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        for m in pkg.models:
            want = kv_formula_bytes(m)
            a = m.architecture
            yield from self.differs(
                m.kv.bytes,
                want,
                f"kv.bytes of {m.alias!r} does not match 2*{a.n_layers}*{a.n_kv_heads}*{a.head_dim}"
                f"*ceil({a.context_limit}/{m.kv.block_tokens})*{m.kv.block_tokens}*{m.kv.max_sequences}*{DTYPE_BYTES[m.kv.dtype]}",
                field=f"{m.pointer}/kv/bytes",
            )
            named = [s for s in m.sections if s.name == m.kv.section]
            if len(named) != 1:
                yield self.skip(
                    f"kv.section {m.kv.section!r} does not resolve (MAN008)",
                    file=MANIFEST,
                    field=f"{m.pointer}/kv/section",
                )
                continue
            section = named[0]
            yield from self.differs(
                section.size, m.kv.bytes, f"kv section {section.name} is not kv.bytes", field=f"{section.pointer}/size"
            )
            for chip in m.target_chips:
                regions = [r for r in pkg.regions_on(chip) if r.owner == m.alias and r.kind is SectionKind.KV]
                if not regions:
                    yield self.manifest_problem(
                        f"model {m.alias!r} has no kv region on chip {chip}", field="/memory_plan"
                    )
                elif sum(r.size for r in regions) < want:
                    yield self.manifest_problem(
                        f"kv region of {m.alias!r} on chip {chip} is smaller than the KV formula",
                        field=regions[0].pointer,
                        expected=f">= {want}",
                        found=sum(r.size for r in regions),
                    )
        yield self.note("KV sizes match 2*L*H_kv*D*ceil(ctx/block)*block*seqs*bytes for every model")


@dataclass(frozen=True)
class ReservedLine:
    lineno: int
    name: str
    owner: str
    kind: str
    start: int
    end: int
    size: int
    perm: str


_REGION = re.compile(r"^region (\S+) (\S+) (\S+) 0x([0-9a-f]{1,16}) 0x([0-9a-f]{1,17}) ([0-9]{1,20}) ([r-][w-][x-])$")
_CHIP = re.compile(r"^chip ([0-9]{1,2}) dram ([0-9]{1,20})$")
_TOTAL = re.compile(r"^total ([0-9]{1,22})$")
#: Anything but printable text and spaces: C0/C1 controls (CR, tab, VT, FF, NEL ...) and Unicode line separators.
_STRAY = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def parse_reserved_info(
    text: str,
) -> tuple[dict[int, tuple[int, list[ReservedLine], int | None]], list[tuple[int, str]]]:
    """Parse the line format of ``render_reserved_info``; returns ({chip: (dram, regions, total)}, [(line, problem)])."""
    chips: dict[int, tuple[int, list[ReservedLine], int | None]] = {}
    problems: list[tuple[int, str]] = []
    current: int | None = None
    # Lines end at LF only, as grep, awk and a reviewer's pager split them (issue 54): str.splitlines() also
    # splits at CR, VT, FF, NEL, U+2028..., so a CR glued between two regions made one line to grep and two here.
    for lineno, line in enumerate(text.split("\n"), start=1):
        stray = _STRAY.search(line)
        if stray:
            problems.append(
                (
                    lineno,
                    f"control character {stray.group()!r} in the line (lines end at LF only; "
                    "a CR or other line break inside a line hides it from grep and awk)",
                )
            )
            continue
        if not line or line.startswith("#"):
            continue
        if m := _CHIP.match(line):
            current = int(m.group(1))
            if current in chips:
                problems.append((lineno, f"chip {current} appears twice"))
            chips[current] = (int(m.group(2)), [], None)
        elif m := _REGION.match(line):
            if current is None:
                problems.append((lineno, "region line before any 'chip' line"))
                continue
            chips[current][1].append(
                ReservedLine(
                    lineno,
                    m.group(1),
                    m.group(2),
                    m.group(3),
                    int(m.group(4), 16),
                    int(m.group(5), 16),
                    int(m.group(6)),
                    m.group(7),
                )
            )
        elif m := _TOTAL.match(line):
            if current is None:
                problems.append((lineno, "total line before any 'chip' line"))
                continue
            dram, regions, total = chips[current]
            if total is not None:
                problems.append((lineno, f"second total for chip {current}"))
            chips[current] = (dram, regions, int(m.group(1)))
        else:
            problems.append((lineno, f"unrecognised line {line[:80]!r}"))
    return chips, problems


def _perm(kind: SectionKind, writable: bool) -> str:
    return "rw-" if writable else ("r-x" if kind is SectionKind.CODE else "r--")


class ReservedInfoAgrees(PackageRule):
    """model_memory_reserved_info.txt parses and agrees with the manifest memory plan and chip DRAM.

    The reservation file is what people and vendor tools read (the 14.075 GiB per-chip plan of 001 §3 came from it); it
    must say exactly what the manifest's memory_plan says. Format: '# comments', 'chip <n> dram <bytes>', 'region <name>
    <owner> <kind> <start hex> <end hex> <size> <perm>', 'total <bytes>'. Every chip of the plan appears once with dram
    = device_cfg.chip_dram_bytes; every region appears once with the same owner, kind, start, end = start + size, size
    and permission (rw- writable, r-x code, r-- otherwise); the total is the sum of the chip's region sizes.
    """

    id = "MEM006"
    sections = ("001 §3", "001 §6.3", "001 §15.1 item 7")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        try:
            raw = ctx.read_bytes(RESERVED_INFO, RESERVED_INFO_MAX_BYTES)
        except ReadProblem as exc:
            yield self.problem(str(exc), file=RESERVED_INFO)
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield self.problem(f"not UTF-8 (byte {exc.start})", file=RESERVED_INFO)
            return
        chips, problems = parse_reserved_info(text)
        for lineno, problem in problems:
            yield self.problem(problem, file=RESERVED_INFO, field=f"line {lineno}")
        plan_chips = sorted({int(c["chip"]) for c in pkg.document["memory_plan"]["chips"]})
        dram = pkg.device_cfg.chip_dram_bytes
        for chip in plan_chips:
            if chip not in chips:
                yield self.problem(
                    f"chip {chip} of the memory plan is missing",
                    file=RESERVED_INFO,
                    expected=f"chip {chip} dram {dram}",
                )
        for chip, (chip_dram, lines, total) in sorted(chips.items()):
            if chip not in plan_chips:
                yield self.problem(f"chip {chip} is not in the manifest memory plan", file=RESERVED_INFO)
                continue
            yield from self.differs(
                chip_dram, dram, f"chip {chip} dram disagrees with device_cfg.chip_dram_bytes", file=RESERVED_INFO
            )
            yield from self._regions(chip, lines, total, {r.name: r for r in pkg.regions_on(chip)})
        yield self.note(f"agrees with the memory plan for chips {plan_chips}")

    def _regions(
        self, chip: int, lines: list[ReservedLine], total: int | None, plan: dict[str, MemoryRegion]
    ) -> Iterator[Finding]:
        """One chip's region lines against its memory plan: each region once, as the manifest says; the total."""
        seen: set[str] = set()
        for ln in lines:
            where = f"line {ln.lineno}"
            if ln.name in seen:
                yield self.problem(f"region {ln.name} listed twice for chip {chip}", file=RESERVED_INFO, field=where)
            seen.add(ln.name)
            r = plan.get(ln.name)
            if r is None:
                yield self.problem(
                    f"region {ln.name} on chip {chip} is not in the manifest memory plan",
                    file=RESERVED_INFO,
                    field=where,
                )
                continue
            want = (r.owner, r.kind.value, r.vaddr, r.end, r.size, _perm(r.kind, r.writable))
            got = (ln.owner, ln.kind, ln.start, ln.end, ln.size, ln.perm)
            if want != got:
                yield self.problem(
                    f"region {ln.name} on chip {chip} disagrees with the manifest",
                    file=RESERVED_INFO,
                    field=where,
                    expected=f"{want[0]} {want[1]} 0x{want[2]:x} 0x{want[3]:x} {want[4]} {want[5]}",
                    found=f"{got[0]} {got[1]} 0x{got[2]:x} 0x{got[3]:x} {got[4]} {got[5]}",
                )
            if ln.start + ln.size != ln.end:
                yield self.problem(f"region {ln.name}: start + size != end", file=RESERVED_INFO, field=where)
        for name in plan:
            if name not in seen:
                yield self.problem(f"manifest region {name} on chip {chip} is missing", file=RESERVED_INFO)
        want_total = sum(r.size for r in plan.values())
        if total is None:
            yield self.problem(f"chip {chip} has no total line", file=RESERVED_INFO, expected=f"total {want_total}")
        else:
            yield from self.differs(
                total, want_total, f"chip {chip} total disagrees with the memory plan", file=RESERVED_INFO
            )


class RegionPermissions(PackageRule):
    """Region permissions match their kind: code, command and params read-only; KV, workspace, I/O, runtime writable.

    Weights, programs and command streams are never written at run time; marking them writable lets a fault in one job
    corrupt what every later job reads. KV, workspace, I/O staging and runtime metadata are written and must be declared
    writable so the A/B no-shared-writable-state rule (001 §6.2 item 2, MEM003) sees them.
    """

    id = "MEM007"
    sections = ("001 §6.2 item 2", "001 §11.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        for r in pkg.memory_plan:
            yield from self.differs(
                r.writable,
                r.kind.writable,
                f"{r.kind.value} region {r.name} has the wrong permission",
                field=f"{r.pointer}/writable",
            )
        yield self.note(f"{len(pkg.memory_plan)} region permissions match their kinds")


class WorkspaceCoversPeaks(PackageRule):
    """Each model's workspace section covers its declared prefill and decode workspace peaks.

    M_required includes workspace_peak(prefill, decode) and the plan is decided on the prefill peak (001 §8.1-§8.2).
    A.prefill and A.decode may share A's workspace by lifetime (§6.2 item 2), so the model's workspace sections, per
    chip, must be at least max(prefill_peak_bytes, decode_peak_bytes).
    """

    id = "MEM008"
    sections = ("001 §8.1", "001 §6.2 item 2", "001 §15.1 item 7")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        for m in ctx.pkg.models:
            peak = max(m.workspace.prefill_peak_bytes, m.workspace.decode_peak_bytes)
            for chip in m.target_chips:
                have = sum(s.size for s in m.all_sections() if s.kind is SectionKind.WORKSPACE and chip in s.chips)
                if have < peak:
                    yield self.manifest_problem(
                        f"workspace of {m.alias!r} on chip {chip} is smaller than its peak",
                        field=f"{m.pointer}/workspace",
                        expected=f">= {peak}",
                        found=have,
                    )
        yield self.note("workspace sections cover the declared peaks")


class SectionFileFits(PackageRule):
    """A params or command section's file (from its offset) fits inside the section's size.

    A params or command section loads its file, starting at the section's offset, into [vaddr, vaddr+size). File bytes
    beyond size would be written past the section into the next region (or silently dropped, leaving a model with
    truncated weights: 001 §3 lists what happens when weights and addresses disagree). The offset must lie inside the
    file. Code sections are loaded by their ELF program headers instead (ELF004).
    """

    id = "MEM009"
    sections = ("001 §6.2 item 1", "001 §3", "001 §15.1 item 7")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            for s in m.all_sections():
                if s.file is None or s.kind not in (SectionKind.PARAMS, SectionKind.COMMAND):
                    continue
                if not ctx.regular_file(s.file):
                    yield self.skip(
                        f"section {s.name}: file not checked (MAN007/LAY001/LAY002)", file=s.file, field=s.pointer
                    )
                    continue
                n += 1
                size = ctx.walk.entries[s.file].size
                # (message, the field at fault, what it must be, what it is) for the first bound the file breaks
                broken: tuple[str, str, str, int] | None = None
                if s.offset > size:
                    broken = (f"section {s.name} starts past the end of its file", "offset", f"<= {size}", s.offset)
                elif size - s.offset > s.size:
                    broken = (
                        f"the file of section {s.name} is larger than the section",
                        "size",
                        f">= {size - s.offset}",
                        s.size,
                    )
                if broken:
                    message, key, expected, found = broken
                    yield self.problem(message, file=s.file, field=f"{s.pointer}/{key}", expected=expected, found=found)
        yield self.note(f"{n} section files fit their sections")


RULES: tuple[type[Rule], ...] = (
    RegionsDisjoint,
    FitsChipDram,
    PrivateRegions,
    SectionsInRegions,
    KvSize,
    ReservedInfoAgrees,
    RegionPermissions,
    WorkspaceCoversPeaks,
    SectionFileFits,
)
