"""Manifest rules (MAN): the exact ``alias -> graph -> chip -> profile`` map (001 §6.3, §10.4).

Schema validity, unique names, one prefill and one decode graph per model, the
caller's expected model set and batch profiles, the inactive-lane contract for
B>1, and references that resolve. Chip masks are CHIP, addresses are MEM,
tensor shapes are GOLD.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from calctl.package.model import MANIFEST, GraphKind, SectionKind
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import EntryKind, ValidationContext, path_problem

_MASK_DTYPES = frozenset({"uint8", "int8", "int16", "int32"})


class ManifestSchema(Rule):
    """manifest.yaml parses strictly and is valid against the calculet-package/v1 JSON Schema.

    The manifest is parsed with the hardened YAML loader (size limit, no anchors/aliases, no duplicate keys: two readers
    must never disagree about one manifest) and checked against the versioned schema calculet-package/v1 shipped in
    calctl/schemas. Every schema violation is reported with its JSON pointer, not only the first. When this rule fails,
    every rule that needs the typed manifest reports a skip naming MAN001.
    """

    id = "MAN001"
    sections = ("001 §6.3", "001 §10.4", "001 §15.1 item 6", "001 §12 Phase 0 item 3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        m = ctx.manifest
        if m.parse_error:
            yield self.manifest_problem(m.parse_error.removeprefix(f"{MANIFEST}: "))
            return
        for pointer, message in m.schema_errors:
            yield self.manifest_problem(f"schema calculet-package/v1: {message}", field=pointer)
        if m.build_error:
            yield self.manifest_problem(f"schema-valid but not a usable package: {m.build_error}")
        yield self.note("valid against calculet-package/v1")


class UniqueNames(PackageRule):
    """Aliases, model names, graph names, section names and region names are unique.

    The combined-package runner must exit before configure on any duplicate name (001 §6.4): model aliases and names,
    graph names and section names are unique across the whole package, memory regions are unique, parameter tensor names
    are unique within a model and tensor names within a graph's inputs or outputs. 001 §3 forbids renaming subgraphs to
    splice two models together; with unique names and exact lookup (no substring matching, §10.4) such a splice cannot
    go unnoticed.
    """

    id = "MAN002"
    sections = ("001 §6.4", "001 §10.4", "001 §3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        yield from self._dupes("model alias", [(m.alias, f"{m.pointer}/alias") for m in pkg.models])
        yield from self._dupes("model name", [(m.name, f"{m.pointer}/name") for m in pkg.models])
        yield from self._dupes("graph name", [(g.name, f"{g.pointer}/name") for g in pkg.graphs])
        yield from self._dupes(
            "section name", [(s.name, f"{s.pointer}/name") for m in pkg.models for s in m.all_sections()]
        )
        yield from self._dupes("memory region name", [(r.name, f"{r.pointer}/name") for r in pkg.memory_plan])
        for m in pkg.models:
            yield from self._dupes(
                f"parameter tensor name of {m.alias}",
                [(t.name, f"{m.pointer}/params/tensors/{i}/name") for i, t in enumerate(m.params)],
            )
            for g in m.graphs:
                yield from self._dupes(
                    f"input name of {g.name}",
                    [(t.name, f"{g.pointer}/inputs/{i}/name") for i, t in enumerate(g.inputs)],
                )
                yield from self._dupes(
                    f"output name of {g.name}",
                    [(t.name, f"{g.pointer}/outputs/{i}/name") for i, t in enumerate(g.outputs)],
                )
        yield self.note(f"{len(pkg.models)} models, {sum(len(m.graphs) for m in pkg.models)} graphs: all names unique")

    def _dupes(self, what: str, items: list[tuple[str, str]]) -> Iterator[Finding]:
        counts = Counter(name for name, _ in items)
        seen: set[str] = set()
        for name, pointer in items:
            if counts[name] > 1:
                if name in seen:
                    yield self.manifest_problem(f"duplicate {what} {name!r} ({counts[name]} times)", field=pointer)
                seen.add(name)


class PrefillAndDecode(PackageRule):
    """Every model has exactly one prefill graph and exactly one decode graph.

    Each model owns both its prefill and its decode graph (001 §4: sequences never migrate across chips; §6.1: a
    combined package holds model_a.prefill, model_a.decode, model_b.prefill, model_b.decode). A model with no decode
    graph, or two prefill graphs, leaves the loader to guess which one to submit.
    """

    id = "MAN003"
    sections = ("001 §4", "001 §6.1", "001 §6.2 item 6")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        for m in pkg.models:
            for kind in GraphKind:
                names = [g.name for g in m.graphs if g.kind is kind]
                yield from self.differs(
                    len(names),
                    1,
                    f"model {m.alias!r} has {len(names)} {kind.value} graphs"
                    + (f" ({', '.join(names)})" if names else ""),
                    field=f"{m.pointer}/graphs",
                )
        yield self.note(f"{len(pkg.models)} models, each with one prefill and one decode graph")


class ExpectedModels(PackageRule):
    """The package holds exactly the model aliases the caller expects (--expect-models).

    The combined runner validates 'exact four model names and chip targets' before configure (001 §6.4), and the serving
    configuration is cross-checked against the signed manifest (§10.4). With --expect-models a,b the alias set must be
    exactly {a, b}: exact, case-sensitive, no missing and no extra alias. Without the option the rule passes and says
    which aliases it saw.
    """

    id = "MAN004"
    sections = ("001 §6.4", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        have = list(ctx.pkg.aliases)
        want = ctx.policy.expect_models
        if want is None:
            yield self.note(f"not requested (--expect-models); the package has {', '.join(have)}")
            return
        for alias in want:
            if alias not in have:
                yield self.manifest_problem(
                    f"expected model {alias!r} is not in the package",
                    field="/models",
                    expected=sorted(set(want)),
                    found=have,
                )
        for i, alias in enumerate(have):
            if alias not in want:
                yield self.manifest_problem(
                    f"model {alias!r} is not one of the expected models",
                    field=f"/models/{i}/alias",
                    expected=sorted(set(want)),
                    found=have,
                )
        yield self.note(f"exactly the expected models: {', '.join(have)}")


class RequestedProfiles(PackageRule):
    """Every batch profile the caller requests (--profile N) is compiled into every decode graph.

    compiled_batch comes from the validated calbin and cannot be changed by configuration (000 §2); a configuration that
    asks for a profile the package does not have (B8 in a B1-only package) must fail at start-up (000 §15). Each
    --profile N must be one of the batch_profiles of every model's decode graph (decode is where batches are built, 000
    §7-§8). Without --profile the rule passes and lists the compiled profiles.
    """

    id = "MAN005"
    sections = ("000 §15", "000 §8", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        decodes = [(m, g) for m in pkg.models for g in m.graphs if g.kind is GraphKind.DECODE]
        offered = "; ".join(f"{g.name} {list(g.batch_profiles)}" for _, g in decodes) or "no decode graphs"
        if not ctx.policy.profiles:
            yield self.note(f"no profile requested (--profile); compiled decode profiles: {offered}")
            return
        for m in pkg.models:
            if not any(g.kind is GraphKind.DECODE for g in m.graphs):
                yield self.skip(
                    f"model {m.alias!r} has no decode graph (MAN003)", file=MANIFEST, field=f"{m.pointer}/graphs"
                )
        for p in ctx.policy.profiles:
            for _m, g in decodes:
                if p not in g.batch_profiles:
                    yield self.manifest_problem(
                        f"requested batch profile B{p} is not compiled into {g.name}",
                        field=f"{g.pointer}/batch_profiles",
                        expected=f"contains {p}",
                        found=list(g.batch_profiles),
                    )
        yield self.note(f"requested profiles {list(ctx.policy.profiles)} present in: {offered}")


class InactiveLaneContractDeclared(PackageRule):
    """A graph with a batch profile B>1 declares the inactive-lane contract (mask input, no KV writes).

    Never pad an inactive lane with token 0 (000 §7.3): a B>1 profile is only usable with the vendor's contract for
    inactive lanes: the valid-mask input (a declared integer input of the graph, leading with the batch dimension B, and
    not a data input such as tokens, positions or the valid-length input), the KV manager mode, whether logits are
    returned, and whether an inactive lane writes KV, which it must not (000 §17.3: 'inactive lane 不写 KV' is mandatory
    for B>1). Without the contract the profile must not reach Ready.
    """

    id = "MAN006"
    sections = ("000 §7.3", "000 §17.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        batched = 0
        for m in ctx.pkg.models:
            for g in m.graphs:
                if max(g.batch_profiles, default=1) <= 1:
                    continue
                batched += 1
                pol = g.inactive_lane_policy
                where = f"{g.pointer}/inactive_lane_policy"
                if pol is None:
                    yield self.manifest_problem(
                        f"graph {g.name} has profiles {list(g.batch_profiles)} but no inactive_lane_policy", field=where
                    )
                    continue
                names = {t.name: t for t in g.inputs}
                mask = names.get(pol.mask_input)
                if mask is None:
                    yield self.manifest_problem(
                        f"mask_input {pol.mask_input!r} is not an input of {g.name}",
                        field=f"{where}/mask_input",
                        expected=sorted(names),
                        found=pol.mask_input,
                    )
                elif pol.mask_input in ("tokens", "positions", g.valid_length_input):
                    # A data input cannot double as the lane mask: its values are tokens or lengths, so
                    # "valid" would be whatever token id happens to be non-zero (000 §7.3).
                    yield self.manifest_problem(
                        f"mask_input {pol.mask_input!r} is a data input of {g.name}, not a lane mask",
                        field=f"{where}/mask_input",
                        expected="a dedicated [B] mask input (e.g. lane_valid)",
                        found=pol.mask_input,
                    )
                elif not mask.shape or mask.shape[0] != "B":
                    yield self.manifest_problem(
                        f"mask input {pol.mask_input!r} does not lead with the batch dimension B",
                        field=f"{where}/mask_input",
                        expected="[B, ...]",
                        found=list(mask.shape),
                    )
                elif mask.dtype not in _MASK_DTYPES:
                    yield self.manifest_problem(
                        f"mask input {pol.mask_input!r} is not an integer mask",
                        field=f"{where}/mask_input",
                        expected=sorted(_MASK_DTYPES),
                        found=mask.dtype,
                    )
                if pol.writes_kv:
                    yield self.manifest_problem(
                        "inactive lanes must not write KV", field=f"{where}/writes_kv", expected=False, found=True
                    )
                if not pol.kv_manager_mode:
                    yield self.manifest_problem(
                        "the KV manager mode for batched lanes is not declared", field=f"{where}/kv_manager_mode"
                    )
        yield self.note(
            f"{batched} graph(s) with B>1, each with a complete inactive-lane contract"
            if batched
            else "no graph has a B>1 profile"
        )


class ReferencedFilesExist(PackageRule):
    """Every file the manifest names exists in the package.

    Sections (ELF programs, command blobs, parameter blobs), parameter tensors, tokenizer files and golden data named by
    the manifest must all be present as files (001 §6.1 lists what each model needs). A name with an unsafe path is
    LAY002's finding and a link or device is LAY001's; this rule reports a skip for those.
    """

    id = "MAN007"
    sections = ("001 §6.1", "001 §6.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        seen: set[str] = set()
        for ref in ctx.references:
            problem = path_problem(ref.rel)
            if problem:
                yield self.skip(f"not looked up: unsafe path (LAY002: {problem})", file=MANIFEST, field=ref.pointer)
                continue
            e = ctx.entry(ref.rel)
            if e is None:
                yield self.manifest_problem(f"names {ref.rel!r}, which is not in the package", field=ref.pointer)
            elif e.kind is EntryKind.DIR:
                yield self.manifest_problem(f"names {ref.rel!r}, which is a directory, not a file", field=ref.pointer)
            elif e.kind is not EntryKind.FILE:
                yield self.skip(f"{ref.rel!r} is a {e.kind.value} (LAY001)", file=MANIFEST, field=ref.pointer)
            seen.add(ref.rel)
        yield self.note(f"{len(seen)} referenced files present")


class InternalReferences(PackageRule):
    """Names inside the manifest resolve: kv.section, and parameter files vs parameter sections.

    kv.section must name exactly one model-level section of kind kv of the same model (each model has its own KV base,
    001 §6.2 item 3), and a model has exactly one such section. Every file holding parameter tensors is the file of
    exactly one params section of the model, and every params section holds tensors (001 §6.1: per-model parameter
    blocks and mapping). Lookups are exact (§10.4).
    """

    id = "MAN008"
    sections = ("001 §6.1", "001 §6.2 item 3", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        for m in ctx.pkg.models:
            named = [s for s in m.sections if s.name == m.kv.section]
            yield from self.differs(
                len(named),
                1,
                f"kv.section {m.kv.section!r} names {len(named)} sections of model {m.alias!r}",
                field=f"{m.pointer}/kv/section",
            )
            if len(named) == 1 and named[0].kind is not SectionKind.KV:
                yield self.manifest_problem(
                    f"kv.section {m.kv.section!r} is a {named[0].kind.value} section",
                    field=f"{m.pointer}/kv/section",
                    expected="kv",
                    found=named[0].kind.value,
                )
            kv_sections = [s for s in m.sections if s.kind is SectionKind.KV]
            yield from self.differs(
                len(kv_sections),
                1,
                f"model {m.alias!r} has {len(kv_sections)} kv sections",
                field=f"{m.pointer}/sections",
            )
            graph_kv = [s for g in m.graphs for s in g.sections if s.kind is SectionKind.KV]
            for s in graph_kv:
                yield self.manifest_problem(
                    "a kv section belongs to the model, not to one graph (prefill and decode share the KV)",
                    field=s.pointer,
                )
            param_files = set(m.param_files)
            params_sections = [s for s in m.all_sections() if s.kind is SectionKind.PARAMS]
            by_file = Counter(s.file for s in params_sections)
            for f in sorted(param_files):
                n = by_file.get(f, 0)
                yield from self.differs(
                    n, 1, f"parameter file {f!r} is the file of {n} params sections", field=f"{m.pointer}/sections"
                )
            for s in params_sections:
                if s.file is None or s.file not in param_files:
                    yield self.manifest_problem(
                        f"params section {s.name!r} holds no parameter tensors",
                        field=f"{s.pointer}/file",
                        expected=sorted(param_files),
                        found=s.file,
                    )
        yield self.note("kv.section and parameter files resolve exactly")


class ModelOwnFiles(PackageRule):
    """Each model's section files, parameter tensors and golden data lie in that model's own directory.

    001 §6.1: each model has its own parameter blocks and mapping ('每个模型独立的参数块'), its own programs, command blobs and
    golden data. Every such file a model names (section files, parameter tensors, golden data) lies under that model's
    directory <alias>/ (docs/package-format.md), and no such file is named by two models. Otherwise model A can load
    model B's parameter blob or command stream, and only a golden run after configure would notice. Tokenizers are bound
    by content instead (TOK003: identical replicas may share one).
    """

    id = "MAN009"
    sections = ("001 §6.1", "001 §6.2 item 2", "001 §3", "docs/package-format.md")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        owners: dict[str, list[str]] = {}
        n = 0
        for ref in ctx.references:
            if "/tokenizer/" in ref.pointer:
                continue  # tokenizers bind by content, and identical replicas may share one (TOK003)
            n += 1
            owners.setdefault(ref.rel, [])
            if ref.model not in owners[ref.rel]:
                owners[ref.rel].append(ref.model)
            prefix = f"{ref.model}/"
            if not ref.rel.startswith(prefix):
                yield self.manifest_problem(
                    f"model {ref.model!r} names a file outside its own directory",
                    field=ref.pointer,
                    expected=f"{prefix}...",
                    found=ref.rel,
                )
        for rel, models in owners.items():
            if len(models) > 1:
                yield self.manifest_problem(
                    f"{rel!r} is named by models {', '.join(repr(a) for a in models)}; each model has its own files",
                    field="/models",
                )
        yield self.note(f"{n} file references, each inside its own model's directory")


RULES: tuple[type[Rule], ...] = (
    ManifestSchema,
    UniqueNames,
    PrefillAndDecode,
    ExpectedModels,
    RequestedProfiles,
    InactiveLaneContractDeclared,
    ReferencedFilesExist,
    InternalReferences,
    ModelOwnFiles,
)
