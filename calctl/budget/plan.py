"""Per-chip capacity plans (001 §8.1) and the exact searches on them.

A :class:`ChipLoad` is what one chip must hold: the models placed on it (each a
:class:`ModelLoad`: its shape, how many chips it is split over, and whatever the
package or the user states about its sizes) plus memory-plan regions that no
model on the chip owns. :func:`evaluate` turns a load at a (context, sequences)
point into a :class:`ChipBudget` listing every §8.1 term with its source and the
§8.2 verdict. :func:`max_context_on_chip` and :func:`max_sequences_on_chip` are exact integer
binary searches over that evaluation; they are valid because every term is
non-decreasing in context and in sequences.

Sources (``Source``): ``manifest`` the package states it; ``config`` the
config.json or a command-line option states it; ``formula`` computed exactly from
stated numbers (KV); ``policy`` the §8.2 guard; ``estimate`` nobody states it, so
a heuristic or project default (:class:`Estimates`) fills it in and says so.

The builders, :func:`~calctl.budget.builders.plan_from_package` and
:func:`~calctl.budget.builders.plan_from_config`, are :mod:`calctl.budget.builders`.
This module does no I/O and prints nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from calctl import limits
from calctl.budget.kv import kv_bytes, kv_bytes_per_token, kv_heads_per_chip
from calctl.budget.policy import BudgetPolicy, BudgetVerdict
from calctl.budget.shape import ModelShape
from calctl.budget.units import DTYPE_BITS, GIB, MIB, bits_to_bytes, fraction, human
from calctl.budget.weights import count_params, weight_bytes
from calctl.errors import UsageError

#: Per-chip local DRAM assumed when nothing states it: the reference board class
#: (the mock board's figure, calctl.compiler.writer.CHIP_DRAM_BYTES). 001 §8.2: only the
#: vendor-confirmed local figure is a real input.
DEFAULT_CHIP_DRAM_BYTES = 16 * GIB

#: Search ceilings, the one table's (calctl.limits). Nothing real gets near them; they keep the search finite
#: when a model's KV stops growing (every layer a sliding window).
MAX_CONTEXT = limits.MAX_CONTEXT.maximum
MAX_SEQUENCES = limits.MAX_SEQUENCES.maximum


class Source(str, enum.Enum):
    MANIFEST = "manifest"
    CONFIG = "config"
    FORMULA = "formula"
    POLICY = "policy"
    ESTIMATE = "estimate"


# A term summed over several models is only as good as its weakest part.
_STRENGTH = {Source.ESTIMATE: 0, Source.FORMULA: 1, Source.CONFIG: 2, Source.MANIFEST: 3, Source.POLICY: 4}

# The terms of 001 §8.1, in the report's order.
W_COMPILED = "W_compiled"
KV = "KV"
WORKSPACE = "workspace_peak"
CODE = "code_and_commands"
IO = "io_staging"
RUNTIME = "runtime_metadata"
FRAGMENTATION = "allocator_fragmentation"
GUARD = "safety_guard"
COMPONENTS = (W_COMPILED, KV, WORKSPACE, CODE, IO, RUNTIME, FRAGMENTATION, GUARD)


@dataclass(frozen=True)
class Component:
    """One §8.1 term on one chip."""

    name: str
    bytes: int
    source: Source
    detail: str


@dataclass(frozen=True)
class Stated:
    """A size some document states (the manifest, the config or an option)."""

    bytes: int
    source: Source
    detail: str


@dataclass(frozen=True)
class Estimates:
    """Project defaults for the terms neither a package nor a config states.

    001 §15.1 item 7 asks the compiler for a static/peak memory report listing
    weights, KV, workspace, code, command, I/O and guard; until a package carries
    one, these fill the gaps and every use is labelled ``estimate``.
    """

    #: ELF code + command blobs per model per chip (the mock packages use 2 MiB).
    code_and_commands_bytes: int = 64 * MIB
    #: Runtime job descriptors, KV manager tables, sync units per model per chip.
    runtime_metadata_bytes: int = 64 * MIB
    #: Floor of the host<->device staging estimate.
    io_min_bytes: int = 4 * MIB
    #: 001 §8.4: fragmentation "cannot be determined statically"; this share of
    #: W + KV + workspace stands in until 100 load/unload cycles measure it.
    fragmentation: float = 0.05
    #: Activation element width in the workspace estimate (bf16).
    activation_bits: int = 16
    #: Logits element width (fp32, as the packages' logits outputs).
    logits_bits: int = 32


@dataclass(frozen=True)
class WorkspaceOverride:
    """Workspace figures given by the user: the peak itself, or per phase."""

    peak_bytes: int | None = None
    prefill_bytes: int | None = None
    decode_bytes: int | None = None


@dataclass(frozen=True)
class ModelLoad:
    """One model's share of one chip."""

    alias: str
    shape: ModelShape
    #: Chips the model is split over (tensor parallel); 1 = the whole model is here.
    split: int
    weight_dtype: str
    kv_dtype: str
    block_tokens: int
    #: Context and active sequences when the caller gives none (package: context_limit
    #: and kv.max_sequences; config: max_position_embeddings and 1, 001 §8.3 B1).
    default_context: int | None
    default_sequences: int
    weights: Stated | None = None
    code_and_commands: Stated | None = None
    io_staging: Stated | None = None
    runtime_metadata: Stated | None = None
    workspace_peak: Stated | None = None
    prefill_workspace: Stated | None = None
    decode_workspace: Stated | None = None
    kv_detail: str = ""
    #: What the package's memory plan reserves on this chip for the model's workspace and KV. A
    #: reservation is memory the chip must hold whatever the declared peak or the formula says, so
    #: each is a floor under its term (a 20 GiB workspace region does not fit a 16 GiB chip).
    reserved_workspace: Stated | None = None
    reserved_kv: Stated | None = None
    #: (context, sequences) the KV reservation was compiled for; a what-if at another point ignores it.
    reserved_kv_at: tuple[int, int] | None = None

    @property
    def kv_heads(self) -> int:
        return kv_heads_per_chip(self.shape.n_kv_heads, self.split)

    def context(self, context: int | None) -> int:
        if context is not None:
            return context
        if self.default_context is None:
            raise UsageError(
                f"{self.alias}: no context given and the model states no context limit",
                hint="give --context (the config has no max_position_embeddings)",
            )
        return self.default_context

    def sequences(self, sequences: int | None) -> int:
        return self.default_sequences if sequences is None else sequences

    def chip_kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.shape, self.kv_dtype, kv_heads=self.kv_heads)


@dataclass(frozen=True)
class ChipLoad:
    """Everything one chip must hold."""

    chip: int
    dram_bytes: int
    dram_source: Source
    models: tuple[ModelLoad, ...]
    #: Memory-plan regions on this chip that no model placed here owns; counted as stated.
    shared: tuple[Component, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def context_limit(self) -> int | None:
        limits = [m.shape.context_limit for m in self.models if m.shape.context_limit is not None]
        return min(limits) if limits else None


@dataclass(frozen=True)
class ChipBudget:
    """The §8.1 terms on one chip at one point, and the §8.2 verdict."""

    chip: int
    models: tuple[str, ...]
    components: tuple[Component, ...]
    static_bytes: int
    required_bytes: int
    dram_bytes: int
    limit_bytes: int
    guard_bytes: int
    usable_bytes: int
    verdict: BudgetVerdict
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    dram_source: Source = Source.MANIFEST

    @property
    def headroom_bytes(self) -> int:
        """Usable minus static: negative when NO-GO."""
        return self.usable_bytes - self.static_bytes

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)


class Bound(str, enum.Enum):
    """What stopped a search."""

    MEMORY = "memory"
    MODEL_LIMIT = "model context limit"
    CEILING = "search ceiling"


@dataclass(frozen=True)
class SearchResult:
    value: int
    bound: Bound


@dataclass(frozen=True)
class BudgetInput:
    kind: str  # "package" | "hf-config"
    name: str
    path: str
    version: str | None = None


@dataclass(frozen=True)
class BudgetPlan:
    """Chip loads plus the whole models (once each) and what was assumed building them."""

    input: BudgetInput
    loads: tuple[ChipLoad, ...]
    models: tuple[ModelLoad, ...]
    chips_per_model: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()


# ---------------------------------------------------------------------------
# Evaluation


def _activation_elements(shape: ModelShape, split: int) -> int:
    """Activation elements live per token inside one layer on one chip.

    Residual in and out (replicated under tensor parallelism), q/k/v, and the widest
    MLP intermediate (gate and up outputs; for an expert layer the routed top-k plus
    shared experts). Attention is assumed tiled: no tokens x tokens score matrix.
    """
    attention = -(-(shape.q_width + 2 * shape.kv_width) // split)
    per_branch = 2 if shape.gated_mlp else 1
    widths = [shape.intermediate] if any(not shape.is_sparse(i) for i in range(shape.n_layers)) else []
    if shape.moe is not None:
        widths.append(shape.moe.experts_per_token * shape.moe.expert_intermediate + shape.moe.shared_intermediate)
    mlp = -(-per_branch * max(widths, default=0) // split)
    return 2 * shape.hidden + attention + mlp


def _estimate_workspace(m: ModelLoad, context: int, sequences: int, est: Estimates) -> tuple[int, int]:
    """(prefill, decode) workspace estimates: one B1 prompt of ``context`` tokens (000 §6
    prefills one sequence per job), and one decode step over ``sequences`` lanes."""
    width = _activation_elements(m.shape, m.split)
    logits = m.shape.vocab * est.logits_bits
    prefill = bits_to_bytes(context * width * est.activation_bits + logits)
    decode = bits_to_bytes(sequences * (width * est.activation_bits + logits))
    return prefill, decode


def _estimate_io(m: ModelLoad, context: int, sequences: int, est: Estimates) -> int:
    """Double-buffered (ping/pong) prompt ids, decode tokens+positions and fp32 logits."""
    bits = 2 * (context * 32 + sequences * 64 + sequences * m.shape.vocab * est.logits_bits)
    return max(est.io_min_bytes, -(-bits_to_bytes(bits) // MIB) * MIB)


def _model_terms(
    m: ModelLoad, context: int, sequences: int, est: Estimates, kv_override: int | None
) -> dict[str, Component]:
    terms: dict[str, Component] = {}

    if m.weights is not None:
        terms[W_COMPILED] = Component(W_COMPILED, m.weights.bytes, m.weights.source, m.weights.detail)
    else:
        count = count_params(m.shape)
        split = f" / {m.split} chips (matrices split, norms replicated)" if m.split > 1 else ""
        terms[W_COMPILED] = Component(
            W_COMPILED,
            weight_bytes(count, m.weight_dtype, chips=m.split),
            Source.ESTIMATE,
            f"estimate: {count.total:,} parameters x {m.weight_dtype}{split}; no quantisation scales or padding "
            "(a compiled package states W_compiled)",
        )

    if kv_override is not None:
        terms[KV] = Component(
            KV, kv_override, Source.FORMULA, f"{kv_override:,} bytes of KV tokens asked for; {m.kv_detail}"
        )
    else:
        value = kv_bytes(
            m.shape,
            context=context,
            sequences=sequences,
            kv_dtype=m.kv_dtype,
            kv_heads=m.kv_heads,
            block_tokens=m.block_tokens,
        )
        elem = DTYPE_BITS[m.kv_dtype] / 8
        sliding = [w for w in m.shape.windows if w is not None]
        windows = f"; {len(sliding)} sliding layers hold at most {min(sliding)} tokens" if sliding else ""
        terms[KV] = Component(
            KV,
            value,
            Source.FORMULA,
            f"2 x {m.shape.n_layers} layers x {m.kv_heads} KV heads x {m.shape.head_dim} head_dim x "
            f"{context} tokens x {sequences} seq x {elem:g} B ({m.kv_dtype}){windows}; {m.kv_detail}",
        )

    if m.workspace_peak is not None:
        ws = m.workspace_peak
        terms[WORKSPACE] = Component(WORKSPACE, ws.bytes, ws.source, ws.detail)
    else:
        est_prefill, est_decode = _estimate_workspace(m, context, sequences, est)
        prefill = m.prefill_workspace or Stated(est_prefill, Source.ESTIMATE, f"prefill of {context} tokens, estimate")
        decode = m.decode_workspace or Stated(est_decode, Source.ESTIMATE, f"decode of {sequences} seq, estimate")
        # 001 §8.2: the prefill peak, not the decode steady state, decides deployability;
        # prefill and decode of one model reuse one workspace (001 §6.2 item 2).
        peak = prefill if prefill.bytes >= decode.bytes else decode
        terms[WORKSPACE] = Component(
            WORKSPACE,
            peak.bytes,
            peak.source,
            f"max(prefill {human(prefill.bytes)} [{prefill.detail}], decode {human(decode.bytes)} [{decode.detail}])",
        )

    code = m.code_and_commands or Stated(
        est.code_and_commands_bytes,
        Source.ESTIMATE,
        f"{human(est.code_and_commands_bytes)} per model per chip, estimate",
    )
    terms[CODE] = Component(CODE, code.bytes, code.source, code.detail)

    io = m.io_staging or Stated(
        _estimate_io(m, context, sequences, est),
        Source.ESTIMATE,
        "ping/pong prompt ids, decode tokens and fp32 logits, estimate",
    )
    terms[IO] = Component(IO, io.bytes, io.source, io.detail)

    rt = m.runtime_metadata or Stated(
        est.runtime_metadata_bytes, Source.ESTIMATE, f"{human(est.runtime_metadata_bytes)} per model per chip, estimate"
    )
    terms[RUNTIME] = Component(RUNTIME, rt.bytes, rt.source, rt.detail)
    # The compiled reservations are floors at the compiled point only: a what-if (another context,
    # batch or workspace) asks about a different compilation.
    compiled_point = m.reserved_kv_at == (context, sequences)
    ws_stated = m.workspace_peak is None and all(
        w is not None and w.source is Source.MANIFEST for w in (m.prefill_workspace, m.decode_workspace)
    )
    return _floor_by_reservations(m, terms, kv_floor=kv_override is None and compiled_point, workspace_floor=ws_stated)


def _floor_by_reservations(
    m: ModelLoad, terms: dict[str, Component], *, kv_floor: bool, workspace_floor: bool
) -> dict[str, Component]:
    """A term is never less than the memory-plan region reserved for it on this chip."""
    floors = []
    if workspace_floor:
        floors.append((WORKSPACE, m.reserved_workspace))
    if kv_floor:
        floors.append((KV, m.reserved_kv))
    for name, reserved in floors:
        if reserved is not None and reserved.bytes > terms[name].bytes:
            was = terms[name]
            terms[name] = Component(
                name,
                reserved.bytes,
                reserved.source,
                f"{reserved.detail} reserves {human(reserved.bytes)}, more than the {human(was.bytes)} of "
                f"[{was.detail}]",
            )
    return terms


def _merge(name: str, parts: list[tuple[str, Component]]) -> Component:
    total = sum(c.bytes for _, c in parts)
    source = min((c.source for _, c in parts), key=_STRENGTH.__getitem__) if parts else Source.MANIFEST
    if len(parts) == 1:
        detail = parts[0][1].detail
    else:
        detail = "; ".join(f"{who}: {human(c.bytes)} ({c.source.value})" for who, c in parts)
    return Component(name, total, source, detail)


def evaluate(
    load: ChipLoad,
    policy: BudgetPolicy,
    estimates: Estimates = Estimates(),
    *,
    context: int | None = None,
    sequences: int | None = None,
    kv_override: Mapping[str, int] | None = None,
) -> ChipBudget:
    """The budget of one chip at ``context`` tokens x ``sequences`` active sequences.

    ``None`` means each model's default. ``kv_override`` replaces the KV formula of
    the named models with a byte count (used by :mod:`calctl.budget.capacity`).
    """
    per_term: dict[str, list[tuple[str, Component]]] = {n: [] for n in COMPONENTS}
    for m in load.models:
        override = None if kv_override is None else kv_override.get(m.alias)
        terms = _model_terms(m, m.context(context), m.sequences(sequences), estimates, override)
        for name, comp in terms.items():
            per_term[name].append((m.alias, comp))
    for comp in load.shared:
        per_term[comp.name].append((comp.detail, comp))

    components = [_merge(n, per_term[n]) for n in COMPONENTS if n not in (FRAGMENTATION, GUARD)]
    # 001 §8.4: fragmentation is not statically determinable; a share of what is allocated.
    basis = sum(c.bytes for c in components if c.name in (W_COMPILED, KV, WORKSPACE))
    frac = Fraction(str(estimates.fragmentation)) * basis
    frag = -(-frac.numerator // frac.denominator)
    components.append(
        Component(
            FRAGMENTATION,
            frag,
            Source.ESTIMATE,
            f"{fraction(estimates.fragmentation)} of W + KV + workspace, "
            "estimate (001 §8.4: measure after 100 load/unload cycles)",
        )
    )
    static = sum(c.bytes for c in components)
    guard = policy.guard_bytes(load.dram_bytes)
    components.append(
        Component(
            GUARD,
            guard,
            Source.POLICY,
            f"max({human(policy.guard_min_bytes)}, {fraction(policy.guard_fraction)} of chip DRAM) reserve (001 §8.2)",
        )
    )
    judgement = policy.judge(static, load.dram_bytes)
    return ChipBudget(
        chip=load.chip,
        models=tuple(m.alias for m in load.models),
        components=tuple(components),
        static_bytes=static,
        required_bytes=static + guard,
        dram_bytes=load.dram_bytes,
        limit_bytes=policy.limit_bytes(load.dram_bytes),
        guard_bytes=guard,
        usable_bytes=policy.usable_bytes(load.dram_bytes),
        verdict=judgement.verdict,
        reasons=judgement.reasons,
        notes=load.notes,
        dram_source=load.dram_source,
    )


def passes(
    load: ChipLoad,
    policy: BudgetPolicy,
    estimates: Estimates = Estimates(),
    *,
    context: int | None = None,
    sequences: int | None = None,
) -> bool:
    return evaluate(load, policy, estimates, context=context, sequences=sequences).verdict is BudgetVerdict.GO


def largest_passing(pred: Callable[[int], bool], ceiling: int) -> int:
    """Largest ``n`` in ``1..ceiling`` with ``pred(n)``, or 0; ``pred`` must be true up to a point, then false.

    Exact binary search over integers: O(log ceiling) evaluations.
    """
    if ceiling < 1 or not pred(1):
        return 0
    if pred(ceiling):
        return ceiling
    lo, hi = 1, ceiling  # pred(lo) holds, pred(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_context_on_chip(
    load: ChipLoad, policy: BudgetPolicy, estimates: Estimates = Estimates(), *, sequences: int | None = None
) -> SearchResult:
    """Largest context (same for every model on the chip) that is GO at ``sequences``.

    Never above the models' own context limit; KV block rounding is part of the
    evaluation, so a memory-bound result ends on a block boundary.
    """
    limit = load.context_limit
    ceiling = limit if limit is not None else MAX_CONTEXT
    value = largest_passing(lambda c: passes(load, policy, estimates, context=c, sequences=sequences), ceiling)
    if value < ceiling:
        return SearchResult(value, Bound.MEMORY)
    return SearchResult(value, Bound.MODEL_LIMIT if limit is not None else Bound.CEILING)


def max_sequences_on_chip(
    load: ChipLoad, policy: BudgetPolicy, estimates: Estimates = Estimates(), *, context: int | None = None
) -> SearchResult:
    """Largest number of active sequences (each at ``context`` tokens) that is GO."""
    value = largest_passing(lambda s: passes(load, policy, estimates, context=context, sequences=s), MAX_SEQUENCES)
    return SearchResult(value, Bound.MEMORY if value < MAX_SEQUENCES else Bound.CEILING)
