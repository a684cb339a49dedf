"""Chip-mask rules (CHIP): which chips each section, graph and model may touch.

These enforce what 001 §3 and §6.2 forbid: a model A section carrying chip1's
mask, masks beyond ``chip_nums``, an SCHIP graph touching a chip outside its
``tarChipN``, any cross-chip or cross-model section (gather/reduce/D2D), and a
missing or extra ELF for a (CalCore, chip) pair. Addresses inside a chip are
MEM; the ELF files themselves are ELF.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from calctl.package import binding
from calctl.package.model import ChipMode, Graph, Model, Package, Section, SectionKind, mask_of_chips
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import ReadProblem, ValidationContext


def _owned_sections(m: Model) -> Iterator[tuple[Section, Graph | None]]:
    for s in m.sections:
        yield s, None
    for g in m.graphs:
        for s in g.sections:
            yield s, g


def _hex(mask: int) -> str:
    return f"0x{mask:x}"


def _mask_problem(rule: Rule, s: Section, message: str, expected: str) -> Finding:
    """A section whose chip_mask is wrong: the finding points at the mask and shows it in hex."""
    return rule.manifest_problem(message, field=f"{s.pointer}/chip_mask", expected=expected, found=_hex(s.chip_mask))


class MasksWithinChipNums(PackageRule):
    """Every chip mask, target chip and memory-plan chip lies within device_cfg.chip_nums.

    The board has device_cfg.chip_nums chips (two on the Calculet board). A chipMask bit, a tarChipN entry or a
    memory-plan chip at or beyond chip_nums addresses a chip that does not exist; the runner must exit before configure
    on any mask overreach (001 §6.4).
    """

    id = "CHIP001"
    sections = ("001 §2.3", "001 §6.4", "001 §15.1 item 6")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        n = pkg.device_cfg.chip_nums
        allowed = (1 << n) - 1
        for m in pkg.models:
            targeting = [(f"model {m.alias!r}", m.pointer, m.target_chips)]
            targeting += [(f"graph {g.name}", g.pointer, g.target_chips) for g in m.graphs]
            for who, pointer, chips in targeting:
                for c in chips:
                    if c >= n:
                        yield self.manifest_problem(
                            f"{who} targets chip {c}",
                            field=f"{pointer}/target_chips",
                            expected=f"chips 0..{n - 1}",
                            found=list(chips),
                        )
            for s, _g in _owned_sections(m):
                if s.chip_mask & ~allowed:
                    yield _mask_problem(
                        self,
                        s,
                        f"section {s.name} has mask bits beyond chip_nums={n}",
                        f"within {_hex(allowed)}",
                    )
        for r in pkg.memory_plan:
            if r.chip >= n:
                yield self.manifest_problem(
                    f"memory region {r.name} is on chip {r.chip}",
                    field=r.pointer,
                    expected=f"chips 0..{n - 1}",
                    found=r.chip,
                )
        yield self.note(f"all masks within chip_nums={n}")


def _schip_targets_one(rule: Rule, who: str, placed: Model | Graph) -> Iterator[Finding]:
    """CHIP002 on a model or a graph: if it is SCHIP, it has exactly one target chip."""
    if placed.chip_mode is ChipMode.SCHIP and len(placed.target_chips) != 1:
        yield rule.manifest_problem(
            f"SCHIP {who} must target exactly one chip",
            field=f"{placed.pointer}/target_chips",
            expected="one chip",
            found=list(placed.target_chips),
        )


class GraphTargets(PackageRule):
    """Graph chip modes and targets agree with their model; combined packages are SCHIP per model.

    An SCHIP model or graph has exactly one target chip (tarChipN); a graph targets only chips of its model, and an
    SCHIP model's graphs are SCHIP on the same chip. A combined or replica package places every model SCHIP on its own
    chip (001 §6.1: model_a.* -> tarChipN=[0], model_b.* -> [1]); a tensor-parallel MCHIP model cannot be split into two
    models (§3). The package kind must agree with the model count: single has one model, combined and replica have two
    or more.
    """

    id = "CHIP002"
    sections = ("001 §6.1", "001 §15.1 item 6", "001 §3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        multi = pkg.kind in ("combined", "replica")
        if pkg.kind == "single" and len(pkg.models) != 1:
            yield self.manifest_problem(
                "a single package holds exactly one model", field="/package/kind", expected=1, found=len(pkg.models)
            )
        if multi and len(pkg.models) < 2:
            yield self.manifest_problem(
                f"a {pkg.kind} package holds at least two models",
                field="/package/kind",
                expected=">= 2",
                found=len(pkg.models),
            )
        for m in pkg.models:
            yield from _schip_targets_one(self, f"model {m.alias!r}", m)
            if multi and m.chip_mode is not ChipMode.SCHIP:
                yield self.manifest_problem(
                    f"model {m.alias!r} of a {pkg.kind} package must be SCHIP",
                    field=f"{m.pointer}/chip_mode",
                    expected="SCHIP",
                    found=m.chip_mode.value,
                )
            for g in m.graphs:
                yield from _schip_targets_one(self, f"graph {g.name}", g)
                outside = [c for c in g.target_chips if c not in m.target_chips]
                if outside:
                    yield self.manifest_problem(
                        f"graph {g.name} targets chips its model {m.alias!r} does not",
                        field=f"{g.pointer}/target_chips",
                        expected=f"subset of {list(m.target_chips)}",
                        found=list(g.target_chips),
                    )
                if m.chip_mode is ChipMode.SCHIP and g.chip_mode is not ChipMode.SCHIP:
                    yield self.manifest_problem(
                        f"graph {g.name} of SCHIP model {m.alias!r} is {g.chip_mode.value}",
                        field=f"{g.pointer}/chip_mode",
                        expected="SCHIP",
                        found=g.chip_mode.value,
                    )
        yield self.note("graph chip modes and targets agree with their models")


class SingleChipSections(PackageRule):
    """Sections of an SCHIP graph/model carry exactly its target chip; MCHIP sections stay on its targets.

    In an SCHIP graph every section's chipMask is exactly the bit of its one target chip. A section whose mask has more
    than one bit is a cross-chip section (gather, reduce or D2D), which 001 §6.2 item 5 forbids and §15.1 item 8 asks
    the compiler to prove absent; hand-editing masks (3 -> 1 or 2) is explicitly forbidden by §3. Sections of an MCHIP
    graph or model may span several chips, but only chips in its tarChipN.
    """

    id = "CHIP003"
    sections = ("001 §3", "001 §6.2 items 4-5", "001 §6.4", "001 §15.1 item 8")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            for s, g in _owned_sections(m):
                n += 1
                mode = g.chip_mode if g is not None else m.chip_mode
                targets = g.target_chips if g is not None else m.target_chips
                owner = f"graph {g.name}" if g is not None else f"model {m.alias!r}"
                target_mask = mask_of_chips(list(targets))
                if mode is ChipMode.SCHIP:
                    if len(s.chips) > 1:
                        yield _mask_problem(
                            self,
                            s,
                            f"cross-chip section (gather/reduce/D2D) {s.name} in "
                            f"SCHIP {owner}: mask covers chips {list(s.chips)}",
                            _hex(target_mask),
                        )
                    elif s.chip_mask != target_mask:
                        yield _mask_problem(
                            self,
                            s,
                            f"section {s.name} of SCHIP {owner} is on chip {list(s.chips)}, not its target",
                            _hex(target_mask),
                        )
                elif s.chip_mask & ~target_mask:
                    yield _mask_problem(
                        self,
                        s,
                        f"section {s.name} of MCHIP {owner} reaches chips outside its targets",
                        f"within {_hex(target_mask)}",
                    )
        yield self.note(f"{n} sections carry only their target chips")


class ChipOwnership(PackageRule):
    """In a multi-model package each chip belongs to one model and no section reaches another model's chip.

    Model A's sections never carry chip1's mask and B's never carry chip0's (001 §6.2 item 4). More generally, the
    target chips of different models are disjoint, and no section of one model has a mask bit for a chip another model
    targets. Two models' engine cores (001 §4's ModelWorkers) only ever borrow submodels already bound to
    their own chip.
    """

    id = "CHIP004"
    sections = ("001 §6.1", "001 §6.2 item 4", "001 §4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        owner_of: dict[int, str] = {}
        for m in pkg.models:
            for c in m.target_chips:
                if c in owner_of and owner_of[c] != m.alias:
                    yield self.manifest_problem(
                        f"models {owner_of[c]!r} and {m.alias!r} both target chip {c}",
                        field=f"{m.pointer}/target_chips",
                    )
                owner_of.setdefault(c, m.alias)
        for m in pkg.models:
            for s, _g in _owned_sections(m):
                for c in s.chips:
                    other = owner_of.get(c)
                    if other is not None and other != m.alias and c not in m.target_chips:
                        yield _mask_problem(
                            self,
                            s,
                            f"section {s.name} of model {m.alias!r} reaches chip {c}, owned by model {other!r}",
                            _hex(mask_of_chips(list(m.target_chips))),
                        )
        yield self.note(
            "each chip is used by one model only" if len(pkg.models) > 1 else "single model: nothing shared"
        )


class CrossModelPlacement(PackageRule):
    """No section of one model lies in a memory region owned by another model (no cross-model section).

    Virtual addresses may repeat across chips, but mask and address together must be unambiguous (001 §6.2 item 1). A
    section of model X whose [vaddr, vaddr+size) on a chip it is placed on overlaps a region that the memory plan gives
    to model Y is a cross-model section: it would read or write Y's weights, KV or workspace (§6.2 items 2 and 5).
    Regions owned by no model of the package are MEM003.
    """

    id = "CHIP005"
    sections = ("001 §6.2 items 1-2 and 5", "001 §6.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        aliases = set(pkg.aliases)
        for m in pkg.models:
            for s, _g in _owned_sections(m):
                for c in s.chips:
                    for r in pkg.regions_on(c):
                        if r.owner != m.alias and r.owner in aliases and s.vaddr < r.end and r.vaddr < s.end:
                            yield self.manifest_problem(
                                f"section {s.name} of model {m.alias!r} overlaps "
                                f"region {r.name} of model {r.owner!r} on chip {c}",
                                field=s.pointer,
                                expected=f"outside [0x{r.vaddr:x}, 0x{r.end:x})",
                                found=f"[0x{s.vaddr:x}, 0x{s.end:x})",
                            )
        yield self.note("no section is placed in another model's memory")


def _expected_pairs(pkg: Package, g: Graph) -> set[tuple[int, int]]:
    return {(core, chip) for chip in g.target_chips for core in range(pkg.device_cfg.calcore_num)}


def _slot_named(rule: Rule, s: Section, what: str, file_what: str) -> Iterator[Finding]:
    """CHIP006/CHIP007 on one section: it names its CalCore and it has its file."""
    if s.calcore is None:
        yield rule.manifest_problem(f"{what} section {s.name} names no CalCore", field=f"{s.pointer}/calcore")
    elif s.file is None:
        yield rule.manifest_problem(f"{what} section {s.name} has no {file_what}", field=f"{s.pointer}/file")


class ElfPerCalCore(PackageRule):
    """Each graph has exactly one ELF per (CalCore, chip) it targets: none missing, none extra, none shared.

    A graph on chip N is run by every CalCore of that chip ('A on chip0' does not mean only ccu0, 001 §6.1), so it has
    one chip-local ccu<k> ELF per CalCore k < device_cfg.calcore_num and per target chip: a code section with a calcore
    index, a file and a one-chip mask. A missing ELF (deleting chip1's ELF to run chip0, forbidden by §3), an extra one,
    two for the same pair, or one file used by two code sections all fail.
    """

    id = "CHIP006"
    sections = ("001 §6.1", "001 §2.2", "001 §3", "001 §6.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        files = Counter(s.file for g in pkg.graphs for s in g.code_sections if s.file)
        n = 0
        for g in pkg.graphs:
            expected = _expected_pairs(pkg, g)
            found: Counter[tuple[int, int]] = Counter()
            for s in g.code_sections:
                n += 1
                yield from _slot_named(self, s, "code", "ELF file")
                if s.calcore is None:
                    continue
                if s.file is not None and files[s.file] > 1:
                    yield self.manifest_problem(
                        f"ELF {s.file!r} is used by {files[s.file]} code sections", field=f"{s.pointer}/file"
                    )
                for chip in s.chips:
                    found[(s.calcore, chip)] += 1
            for pair in sorted(expected - set(found)):
                yield self.manifest_problem(
                    f"graph {g.name} has no ELF for CalCore {pair[0]} on chip {pair[1]}",
                    field=f"{g.pointer}/sections",
                    expected=f"ccu{pair[0]}_chip{pair[1]}",
                    found="none",
                )
            for pair, count in sorted(found.items()):
                if pair not in expected:
                    yield self.manifest_problem(
                        f"graph {g.name} has an extra ELF for CalCore {pair[0]} on chip {pair[1]} "
                        f"(calcore_num={pkg.device_cfg.calcore_num}, targets {list(g.target_chips)})",
                        field=f"{g.pointer}/sections",
                    )
                elif count > 1:
                    yield self.manifest_problem(
                        f"graph {g.name} has {count} ELFs for CalCore {pair[0]} on chip {pair[1]}",
                        field=f"{g.pointer}/sections",
                        expected=1,
                        found=count,
                    )
        yield self.note(f"{n} ELFs, exactly one per (CalCore, chip) of each graph")


class CommandPerCalCore(PackageRule):
    """Each (CalCore, chip) of a graph has its command blob, and no command names another CalCore or chip.

    Next to each chip-local ELF a graph ships the CPU/PLD ping/pong command blobs for that CalCore (001 §6.1). Every
    command section names a CalCore < calcore_num, sits on one chip among the graph's targets and has a file; every
    (CalCore, chip) pair of the graph has at least one. A command for a chip outside the graph is a cross-chip command
    stream (§6.2 item 5).
    """

    id = "CHIP007"
    sections = ("001 §6.1", "001 §6.2 item 5")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        n = 0
        for g in pkg.graphs:
            expected = _expected_pairs(pkg, g)
            found: set[tuple[int, int]] = set()
            for s in g.sections:
                if s.kind is not SectionKind.COMMAND:
                    continue
                n += 1
                yield from _slot_named(self, s, "command", "file")
                if s.calcore is None:
                    continue
                if len(s.chips) != 1:
                    yield _mask_problem(
                        self,
                        s,
                        f"command section {s.name} spans chips {list(s.chips)}",
                        "one chip",
                    )
                for chip in s.chips:
                    if (s.calcore, chip) not in expected:
                        yield self.manifest_problem(
                            f"command section {s.name} is for CalCore {s.calcore} on chip {chip}, "
                            f"outside graph {g.name}",
                            field=s.pointer,
                        )
                    found.add((s.calcore, chip))
            for pair in sorted(expected - found):
                yield self.manifest_problem(
                    f"graph {g.name} has no command blob for CalCore {pair[0]} on chip {pair[1]}",
                    field=f"{g.pointer}/sections",
                )
        yield self.note(f"{n} command blobs, each on its graph's (CalCore, chip) pairs")


class SlotBinding(PackageRule):
    """Every program and command file is bound to exactly one (model, graph, chip, CalCore) slot.

    The runtime receives each code and command file for one slot: one model, one graph, one chip, one CalCore (001 §6.1:
    every chip-local ccu program has its own command blobs; §3: reusing another chip's or model's program is forbidden).
    The manifest alone cannot prove which slot a file was built for, so each file is bound four ways: (1) its path is
    <alias>/<kind>/ccu<calcore>_chip<chip>.elf or .cmd of exactly the section that loads it; (2) one file per slot: no
    file is named by two sections (of any kind, of any model); (3) a command blob's own header (magic CALCMD01, chip,
    CalCore, graph name; calctl.package.binding) names that same chip, CalCore and graph (an ELF's binding note is
    ELF006); (4) a command blob has a non-empty command stream after its header. Copying model B's chip-1 blob over
    model A's chip-0 blob, or pointing A's command section at B's file, fails here even when the package is resealed.
    """

    id = "CHIP008"
    sections = ("001 §6.1", "001 §6.2 item 5", "001 §3", "001 §6.4", "docs/package-format.md")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        uses = Counter(s.file for m in pkg.models for s in m.all_sections() if s.file)
        n = 0
        for m in pkg.models:
            for g in m.graphs:
                for s in g.sections:
                    if s.kind not in (SectionKind.CODE, SectionKind.COMMAND) or s.file is None:
                        continue
                    if s.calcore is None or len(s.chips) != 1:
                        continue  # no slot to bind to: CHIP006 / CHIP007 report the section
                    n += 1
                    chip = s.chips[0]
                    ext = "elf" if s.kind is SectionKind.CODE else "cmd"
                    want = f"{m.alias}/{g.kind.value}/ccu{s.calcore}_chip{chip}.{ext}"
                    if s.file != want:
                        yield self.manifest_problem(
                            f"{s.kind.value} section {s.name} loads a file whose path names another slot",
                            field=f"{s.pointer}/file",
                            expected=want,
                            found=s.file,
                        )
                    if uses[s.file] > 1:
                        yield self.manifest_problem(
                            f"{s.file!r} is named by {uses[s.file]} sections; one file per slot",
                            field=f"{s.pointer}/file",
                            expected=1,
                            found=uses[s.file],
                        )
                    if s.kind is SectionKind.COMMAND:
                        yield from self._command(ctx, s, g, chip)
        yield self.note(f"{n} program and command files, each bound to its own slot")

    def _command(self, ctx: ValidationContext, s: Section, g: Graph, chip: int) -> Iterator[Finding]:
        assert s.file is not None and s.calcore is not None
        reason = ctx.content_gate(s.file)
        if reason:
            yield self.skip(f"command header not read: {reason}", file=s.file, field=s.pointer)
            return
        try:
            head = ctx.read_head(s.file, binding.CMD_HEADER_BYTES)
        except ReadProblem as exc:
            yield self.problem(f"command blob {exc}", file=s.file)
            return
        parsed = binding.parse_command_header(head)
        if isinstance(parsed, str):
            yield self.problem(f"command blob header: {parsed}", file=s.file, field="/header")
            return
        for key, want, got in (
            ("graph", g.name, parsed.graph),
            ("chip", chip, parsed.chip),
            ("calcore", s.calcore, parsed.calcore),
        ):
            if want != got:
                yield self.problem(
                    f"command blob header {key} disagrees with the section that loads it ({s.name})",
                    file=s.file,
                    field=f"/header/{key}",
                    expected=want,
                    found=got,
                )
        size = ctx.walk.entries[s.file].size
        if size <= binding.CMD_HEADER_BYTES:
            yield self.problem(
                "command blob has a header and no command stream",
                file=s.file,
                expected=f"> {binding.CMD_HEADER_BYTES} bytes",
                found=f"{size} bytes",
            )


RULES: tuple[type[Rule], ...] = (
    MasksWithinChipNums,
    GraphTargets,
    SingleChipSections,
    ChipOwnership,
    CrossModelPlacement,
    ElfPerCalCore,
    CommandPerCalCore,
    SlotBinding,
)
