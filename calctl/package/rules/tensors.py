"""Tensor and golden-data rules (GOLD): shapes, dtypes, context and vocabulary agree.

Golden ``.npy`` files are loaded with numpy (``allow_pickle=False``, memory
mapped) only after their hash verified. Running the golden comparison on a
device is ``calctl run-golden``, not validation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from calctl import limits
from calctl.errors import PackageError
from calctl.package import weights
from calctl.package.architecture import expected_tensor_shapes
from calctl.package.model import (
    BATCH_DIM,
    MANIFEST,
    NUMPY_DTYPE,
    QUANT_BLOCKS,
    Graph,
    GraphKind,
    Model,
    ParamTensor,
    SectionKind,
    quant_block_axis,
)
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import EntryKind, ValidationContext, path_problem

GOLDEN_KEYS = ("prompt", "prefill_logits", "decode_tokens")
_INT = frozenset({"int8", "uint8", "int16", "int32", "int64"})
_FLOAT = frozenset({"fp16", "float16", "bf16", "bfloat16", "fp32", "float32"})


def _golden_array(ctx: ValidationContext, m: Model, key: str) -> tuple[object | None, str | None]:
    """(array, None) when the golden file is verified, loads and matches its declaration; else (None, reason)."""
    import numpy as np

    spec = getattr(m.golden, key)
    reason = ctx.content_gate(spec.file)
    if reason:
        return None, f"golden checks skipped: {reason}"
    arr = ctx.npy(spec.file)
    if isinstance(arr, str) or not isinstance(arr, np.ndarray):
        return None, "skipped: GOLD001 failed for this file"
    want = NUMPY_DTYPE.get(spec.dtype)
    if want is None or arr.dtype != np.dtype(want) or tuple(arr.shape) != tuple(spec.shape):
        return None, "skipped: GOLD001 failed for this file"
    return arr, None


class GoldenFilesMatch(PackageRule):
    """Golden .npy files load without pickle and have exactly the declared dtype and shape.

    Every model ships golden input and output (001 §6.1, §15.1 item 1): the prompt token ids, the prefill logits and the
    expected decode tokens. Each is a .npy file that numpy loads with allow_pickle=False (a pickle would execute code)
    and whose dtype and shape are exactly those the manifest declares; bf16 cannot be stored in .npy and is refused for
    golden data.
    """

    id = "GOLD001"
    sections = ("001 §6.1", "001 §6.2 item 6", "001 §13.1", "001 §15.1 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        import numpy as np

        pkg = ctx.pkg
        n = 0
        for m in pkg.models:
            for key in GOLDEN_KEYS:
                spec = getattr(m.golden, key)
                field = f"{m.pointer}/golden/{key}"
                reason = ctx.content_gate(spec.file)
                if reason:
                    yield self.skip(f"golden checks skipped: {reason}", file=spec.file, field=field)
                    continue
                n += 1
                want = NUMPY_DTYPE.get(spec.dtype)
                if want is None:
                    yield self.manifest_problem(
                        f"declared dtype {spec.dtype} cannot be held in a .npy file",
                        field=f"{field}/dtype",
                        expected=sorted(set(NUMPY_DTYPE)),
                        found=spec.dtype,
                    )
                    continue
                arr = ctx.npy(spec.file)
                if isinstance(arr, str):
                    yield self.problem(
                        f"does not load as .npy (allow_pickle=False): {arr}", file=spec.file, field=field
                    )
                    continue
                if not isinstance(arr, np.ndarray):
                    yield self.problem(
                        f"is not a single .npy array (found {type(arr).__name__})", file=spec.file, field=field
                    )
                    continue
                if arr.dtype != np.dtype(want):
                    yield self.problem(
                        "dtype differs from the manifest",
                        file=spec.file,
                        field=f"{field}/dtype",
                        expected=f"{spec.dtype} ({np.dtype(want).str})",
                        found=arr.dtype.str,
                    )
                if tuple(arr.shape) != tuple(spec.shape):
                    yield self.problem(
                        "shape differs from the manifest",
                        file=spec.file,
                        field=f"{field}/shape",
                        expected=list(spec.shape),
                        found=list(arr.shape),
                    )
        yield self.note(f"{n} golden files load and match their declarations")


class ContextLimits(PackageRule):
    """Graph max_seq and golden prompt/decode lengths stay within the model's context limit.

    Context is written per graph into the manifest (001 §6.2 item 6) and cross-checked at start-up (§10.4). Each graph's
    max_seq is at most the model's context_limit; the golden prompt is 2-D [1, n] (or 1-D [n]) with 1 <= n <= the
    prefill graph's max_seq, and prompt plus expected decode tokens fit the context limit (§13.1: the 0 / max / max+1
    boundaries must be handled before submission, so the golden data itself must be inside them).
    """

    id = "GOLD002"
    sections = ("001 §6.2 item 6", "001 §13.1", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        for m in ctx.pkg.models:
            limit = m.architecture.context_limit
            for g in m.graphs:
                if g.max_seq > limit:
                    yield self.manifest_problem(
                        f"graph {g.name} max_seq exceeds the model's context_limit",
                        field=f"{g.pointer}/max_seq",
                        expected=f"<= {limit}",
                        found=g.max_seq,
                    )
            prompt = m.golden.prompt.shape
            decode = m.golden.decode_tokens.shape
            field = f"{m.pointer}/golden"
            if len(prompt) not in (1, 2) or (len(prompt) == 2 and prompt[0] != 1):
                yield self.manifest_problem(
                    "golden prompt must be [n] or [1, n]",
                    field=f"{field}/prompt/shape",
                    expected="[1, n]",
                    found=list(prompt),
                )
                continue
            n = int(prompt[-1])
            prefill = [g for g in m.graphs if g.kind is GraphKind.PREFILL]
            if n < 1:
                yield self.manifest_problem(
                    "golden prompt is empty", field=f"{field}/prompt/shape", expected=">= 1 token", found=n
                )
            for g in prefill:
                if n > g.max_seq:
                    yield self.manifest_problem(
                        f"golden prompt is longer than {g.name} max_seq",
                        field=f"{field}/prompt/shape",
                        expected=f"<= {g.max_seq}",
                        found=n,
                    )
            steps = int(decode[-1]) if decode else 1
            if n + steps > limit:
                yield self.manifest_problem(
                    "golden prompt plus decode tokens exceed the context limit",
                    field=f"{field}/decode_tokens/shape",
                    expected=f"<= {limit}",
                    found=n + steps,
                )
        yield self.note("graph max_seq and golden lengths within each context limit")


class VocabularyAgrees(PackageRule):
    """Golden logits have the model's vocabulary width and golden token ids lie inside the vocabulary.

    prefill_logits' last dimension is architecture.vocab_size; every prompt id and expected decode token is in [0,
    vocab_size), and eos_token_id (if declared) too. A golden file from another model (a mismatched alias, 001 §13.1)
    typically has another vocabulary and is caught here.
    """

    id = "GOLD003"
    sections = ("001 §13.1", "001 §6.2 item 6")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        for m in ctx.pkg.models:
            vocab = m.architecture.vocab_size
            field = f"{m.pointer}/golden"
            logits = m.golden.prefill_logits.shape
            if not logits or logits[-1] != vocab:
                yield self.manifest_problem(
                    "prefill_logits width is not the model's vocab_size",
                    field=f"{field}/prefill_logits/shape",
                    expected=f"[..., {vocab}]",
                    found=list(logits),
                )
            eos = m.architecture.eos_token_id
            if eos is not None and not 0 <= eos < vocab:
                yield self.manifest_problem(
                    "eos_token_id is outside the vocabulary",
                    field=f"{m.pointer}/architecture/eos_token_id",
                    expected=f"< {vocab}",
                    found=eos,
                )
            for key in ("prompt", "decode_tokens"):
                spec = getattr(m.golden, key)
                arr, reason = _golden_array(ctx, m, key)
                if arr is None:
                    yield self.skip(str(reason), file=spec.file, field=f"{field}/{key}")
                    continue
                if spec.dtype not in _INT:
                    yield self.manifest_problem(
                        "token ids must be an integer dtype",
                        field=f"{field}/{key}/dtype",
                        expected="int32",
                        found=spec.dtype,
                    )
                    continue
                if arr.size:  # type: ignore[attr-defined]
                    lo, hi = int(arr.min()), int(arr.max())  # type: ignore[attr-defined]
                    if lo < 0 or hi >= vocab:
                        yield self.problem(
                            "token ids outside the vocabulary",
                            file=spec.file,
                            field=f"{field}/{key}",
                            expected=f"0..{vocab - 1}",
                            found=f"{lo}..{hi}",
                        )
        yield self.note("golden logits and token ids agree with each vocabulary")


class GraphTensors(PackageRule):
    """Graph inputs and outputs are consistent with max_seq, vocab and the batch dimension.

    The exact tensors of each graph are written into the manifest (001 §6.2 item 6). Every graph has an integer input
    'tokens' and a floating output 'logits' whose last dimension is vocab_size; the prefill 'tokens' last dimension is
    max_seq; a decode graph with a B>1 profile uses the batch dimension 'B' as the leading dimension of tokens and
    logits (000 §7); csr.valid_length_input, when set, names an integer input. A mismatch means the host would build
    buffers of the wrong size.
    """

    id = "GOLD004"
    sections = ("001 §6.2 item 6", "000 §7.3", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            vocab = m.architecture.vocab_size
            for g in m.graphs:
                n += 1
                inputs = {t.name: (i, t) for i, t in enumerate(g.inputs)}
                length = (g.max_seq, "prefill tokens length is not max_seq") if g.kind is GraphKind.PREFILL else None
                yield from self._named_tensor(g, "inputs", "tokens", (_INT, "integers", "int32"), length)
                width = (vocab, "logits width is not vocab_size")
                yield from self._named_tensor(g, "outputs", "logits", (_FLOAT, "floating point", "float32"), width)
                vl = g.valid_length_input
                if vl is not None:
                    if vl not in inputs:
                        yield self.manifest_problem(
                            f"csr.valid_length_input {vl!r} is not an input",
                            field=f"{g.pointer}/csr/valid_length_input",
                            expected=sorted(inputs),
                            found=vl,
                        )
                    elif inputs[vl][1].dtype not in _INT:
                        yield self.manifest_problem(
                            "valid-length input must be an integer",
                            field=f"{g.pointer}/inputs/{inputs[vl][0]}/dtype",
                            expected="int32",
                            found=inputs[vl][1].dtype,
                        )
        yield self.note(f"{n} graphs have consistent tokens/logits tensors")

    def _named_tensor(
        self, g: Graph, side: str, name: str, dtype: tuple[frozenset[str], str, str], last: tuple[int, str] | None
    ) -> Iterator[Finding]:
        """The tensor ``name`` of ``g.inputs``/``g.outputs``: present, of an allowed dtype (the set, its wording,
        an example), its last dimension the given one (if any, with the message when not) and, batched, led by B."""
        tensors = {t.name: (i, t) for i, t in enumerate(getattr(g, side))}
        if name not in tensors:
            yield self.manifest_problem(
                f"graph {g.name} has no {name!r} {side[:-1]}",
                field=f"{g.pointer}/{side}",
                expected=name,
                found=sorted(tensors),
            )
            return
        i, t = tensors[name]
        where, shape = f"{g.pointer}/{side}/{i}", list(t.shape)
        allowed, wording, example = dtype
        if t.dtype not in allowed:
            yield self.manifest_problem(
                f"{name} must be {wording}", field=f"{where}/dtype", expected=example, found=t.dtype
            )
        if last is not None and (not shape or shape[-1] != last[0]):
            yield self.manifest_problem(last[1], field=f"{where}/shape", expected=f"[..., {last[0]}]", found=shape)
        batched = g.kind is GraphKind.DECODE and max(g.batch_profiles) > 1
        if batched and (not shape or shape[0] != BATCH_DIM):
            message = f"batched decode {name} must lead with the batch dimension B"
            yield self.manifest_problem(message, field=f"{where}/shape", expected="[B, ...]", found=shape)


class ParamTensorsInBounds(PackageRule):
    """Parameter tensors lie inside their file and params section, without overlapping each other.

    Each model has its own parameter blocks and mapping (001 §6.1). Every tensor's bytes [offset, offset + prod(shape) x
    bytes(dtype)) lie inside its file and inside the params section that loads that file, and tensors of one file do not
    overlap. A mapping that runs past its block reads another tensor's (or another model's) weights: exactly what
    treating param_blk1 as a second model does (§3).
    """

    id = "GOLD005"
    sections = ("001 §6.1", "001 §3", "001 §8.1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            sections = {s.file: s for s in m.all_sections() if s.kind is SectionKind.PARAMS and s.file}
            spans: dict[str, list[tuple[int, int, str]]] = {}
            for i, t in enumerate(m.params):
                n += 1
                where = f"{m.pointer}/params/tensors/{i}"
                if t.dtype in QUANT_BLOCKS and (len(t.shape) != 2 or quant_block_axis(t.name, t.shape) % 32):
                    yield self.manifest_problem(
                        f"tensor {t.name}: a {t.dtype} tensor is a matrix whose block axis is a multiple of 32",
                        field=f"{where}/shape",
                        expected="[in, out] with in % 32 == 0 (embed: [vocab, d_model] with d_model % 32 == 0)",
                        found=list(t.shape),
                    )
                    continue
                end = t.offset + t.nbytes
                e = ctx.entry(t.file) if path_problem(t.file) is None else None
                if e is None or e.kind is not EntryKind.FILE:
                    yield self.skip(
                        f"tensor {t.name}: file not checked "
                        f"({'LAY001' if e is not None and e.kind is not EntryKind.DIR else 'MAN007'})",
                        file=t.file,
                        field=where,
                    )
                elif end > e.size:
                    yield self.problem(
                        f"tensor {t.name} runs past the end of its file",
                        file=t.file,
                        field=where,
                        expected=f"end <= {e.size}",
                        found=end,
                    )
                s = sections.get(t.file)
                if s is None:
                    yield self.skip(
                        f"tensor {t.name}: no params section loads {t.file!r} (MAN008)", file=MANIFEST, field=where
                    )
                elif end > s.size:
                    yield self.manifest_problem(
                        f"tensor {t.name} runs past its params section {s.name}",
                        field=where,
                        expected=f"end <= {s.size}",
                        found=end,
                    )
                spans.setdefault(t.file, []).append((t.offset, end, t.name))
            for file, items in spans.items():
                items.sort()
                for (_a0, a1, an), (b0, _b1, bn) in itertools.pairwise(items):
                    if b0 < a1:
                        yield self.problem(
                            f"tensors {an} and {bn} overlap",
                            file=file,
                            field=f"{m.pointer}/params",
                            expected=f"{bn} offset >= {a1}",
                            found=b0,
                        )
        yield self.note(f"{n} parameter tensors within their files and sections")


class ArchitectureMatchesTensors(PackageRule):
    """The architecture numbers (d_model, n_heads, head_dim, d_ff, vocab, layers) are those of the tensors.

    The budget (001 §8.1: KV = 2 x layers x kv_heads x head_dim x ...), the KV formula check (MEM005) and the runtime
    all trust the manifest's architecture numbers, so they must be the numbers the weights were built with. For each
    model, calctl.package.architecture.expected_tensor_shapes(architecture) gives every parameter tensor the family has,
    with its shape; params.tensors must hold exactly those names with exactly those shapes (none missing, none extra).
    n_heads must be a multiple of n_kv_heads (grouped-query attention). An unknown family fails: its tensors cannot be
    checked.
    """

    id = "GOLD006"
    sections = ("001 §8.1", "001 §6.1", "001 §6.2 item 6")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            a = m.architecture
            where = f"{m.pointer}/architecture"
            if a.n_heads % a.n_kv_heads:
                yield self.manifest_problem(
                    f"model {m.alias!r}: n_heads is not a multiple of n_kv_heads",
                    field=f"{where}/n_kv_heads",
                    expected=f"a divisor of {a.n_heads}",
                    found=a.n_kv_heads,
                )
            try:
                want = expected_tensor_shapes(a)
            except KeyError as exc:
                yield self.manifest_problem(str(exc.args[0] if exc.args else exc), field=f"{where}/family")
                continue
            have = {t.name: (i, t) for i, t in enumerate(m.params)}
            for name, shape in want.items():
                n += 1
                if name not in have:
                    yield self.manifest_problem(
                        f"model {m.alias!r} has no parameter tensor {name} (family {a.family})",
                        field=f"{m.pointer}/params/tensors",
                        expected=f"{name} {list(shape)}",
                        found="absent",
                    )
                    continue
                i, t = have[name]
                if tuple(t.shape) != shape:
                    yield self.manifest_problem(
                        f"tensor {name} of {m.alias!r} does not have the shape its architecture implies",
                        field=f"{m.pointer}/params/tensors/{i}/shape",
                        expected=list(shape),
                        found=list(t.shape),
                    )
            for name, (i, _t) in have.items():
                if name not in want:
                    yield self.manifest_problem(
                        f"tensor {name} of {m.alias!r} is not a tensor of family {a.family}",
                        field=f"{m.pointer}/params/tensors/{i}/name",
                    )
        yield self.note(f"{n} parameter tensors have the shapes their architectures imply")


class ToleranceDiscriminates(PackageRule):
    """The golden tolerance can reject a wrong output: it is narrower than the golden logits' own range.

    run-golden accepts prefill logits within |got - want| <= atol + rtol x |want| of the golden ones (numpy.isclose). A
    tolerance at least as wide as the golden logits' own range (max - min), i.e. atol + rtol x max|want| >= max(want) -
    min(want), or with rtol >= 1 (an all-zero output then passes everywhere), accepts outputs that share nothing with
    the golden ones: the golden check would pass a broken device. It is the finite twin of atol: .inf (refused by
    MAN001). The golden logits must load (GOLD001) for the range to be known; a tolerance is then refused, never only
    warned.
    """

    id = "GOLD007"
    sections = ("001 §13.1", "001 §15.1 item 1", "001 §16 PR1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        import numpy as np

        pkg = ctx.pkg
        n = 0
        for m in pkg.models:
            tol = m.golden.tolerance
            spec = m.golden.prefill_logits
            field = f"{m.pointer}/golden/tolerance"
            reason = ctx.content_gate(spec.file)
            arr = None if reason else ctx.npy(spec.file)
            if reason or not isinstance(arr, np.ndarray) or arr.size == 0 or arr.dtype.kind != "f":
                yield self.skip(
                    f"tolerance not judged: the golden logits do not load ({reason or 'GOLD001'})",
                    file=MANIFEST,
                    field=field,
                )
                continue
            n += 1
            with np.errstate(all="ignore"):
                values = np.asarray(arr, dtype=np.float64)
                spread = float(np.max(values) - np.min(values))
                widest = float(tol.atol + tol.rtol * float(np.max(np.abs(values))))
            if tol.rtol >= 1 or not widest < spread:
                yield self.manifest_problem(
                    f"model {m.alias!r}: the golden tolerance (rtol {tol.rtol:g}, atol {tol.atol:g}) is vacuous: "
                    f"it allows a deviation of {widest:.6g} where the golden logits span only {spread:.6g}, so "
                    "it accepts outputs unrelated to the golden ones",
                    field=field,
                    expected=f"rtol < 1 and atol + rtol x max|logit| < {spread:.6g}",
                    found=f"rtol {tol.rtol:g}, atol {tol.atol:g}",
                )
        yield self.note(f"{n} golden tolerances are narrower than their logits' range")


class ReplicaWeightsEqual(PackageRule):
    """A replica package holds the same model on every chip: the same weights, proven by each tensor's digest.

    A replica is one model on both chips (001 §12 Phase 2 item 1), and TOK003 lets its copies share a tokenizer
    on that ground. So every model of a replica has the first model's architecture and exactly its parameter
    tensors: the same names, dtypes and shapes, and the same SHA-256 over the bytes each tensor maps to (two
    manifests sharing one blob but swapping two tensors' offsets are two models). Tensors in files whose hashes
    verified are compared; a tensor at the same offset of two files with one SHA-256 is not read again.
    """

    id = "GOLD008"
    sections = ("001 §12 Phase 2 item 1", "001 §13.1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        if pkg.kind != "replica" or len(pkg.models) < 2:
            yield self.note(f"a {pkg.kind} package: no replica weights to compare")
            return
        first = pkg.models[0]
        for m in pkg.models[1:]:
            field = f"{m.pointer}/params/tensors"
            if m.architecture != first.architecture:
                yield self.manifest_problem(
                    f"replica model {m.alias!r} does not have the architecture of {first.alias!r}",
                    field=f"{m.pointer}/architecture",
                )
            gate = next((r for t in (*first.params, *m.params) if (r := ctx.content_gate(t.file))), None)
            if gate:
                yield self.skip(f"replica weights not compared: {gate}", field=field)
                continue
            try:
                differ = _differing_weights(ctx, first, m)
            except PackageError as exc:
                yield self.skip(f"replica weights not compared: {exc} (GOLD005)", field=field)
                continue
            if differ:
                yield self.manifest_problem(
                    f"replica model {m.alias!r} does not hold the weights of {first.alias!r}: {len(differ)} "
                    f"tensor(s) differ ({weights.describe(differ)})",
                    field=field,
                    expected=f"the {len(first.params)} tensors of {first.alias!r}, byte for byte",
                    found=f"{len(differ)} different",
                )
        yield self.note(f"{len(pkg.models)} replica models hold the same weights")


def _differing_weights(ctx: ValidationContext, a: Model, b: Model) -> list[str]:
    """Tensors of ``a`` and ``b`` that differ; ranges are hashed only where whole-file digests do not decide."""
    files = ctx.hashes.digests
    assert ctx.root is not None
    root = ctx.root

    def placed(t: ParamTensor) -> str:
        return f"{files.get(t.file)}@{t.offset}+{t.nbytes}"

    suspects = weights.differing(
        weights.tensor_digests(root, a, read=placed), weights.tensor_digests(root, b, read=placed)
    )
    if not suspects:
        return []
    weights.check_extent(root, a)  # a bounded read: PackageError -> a skip naming GOLD005
    weights.check_extent(root, b)
    names = set(suspects)
    da = {t.name: t for t in a.params if t.name in names}
    db = {t.name: t for t in b.params if t.name in names}

    def content(t: ParamTensor, who: Model) -> str:
        digest = weights.range_digest(root / t.file, t.offset, t.nbytes, what=f"tensor {t.name} of {who.alias!r}")
        return weights.tensor_identity(t, digest)

    ra = {n: content(t, a) for n, t in da.items()}
    rb = {n: content(t, b) for n, t in db.items()}
    return weights.differing(ra, rb)


class RopeFiguresInRange(PackageRule):
    """The real-valued architecture figures are finite and in range: rope_theta, norm_eps, rope_freq_factors.

    The decoder rotates pair i of each head by position x rope_theta^(-2i/head_dim) / rope_freq_factors[i]. A base or a
    divisor that is not finite, or far outside what any model uses (calctl.limits.ROPE_THETA, ROPE_FACTOR: the table
    ``import hf`` checks rope_scaling against), builds a model that runs and talks nonsense: an infinite divisor stops
    the rotation, and golden data computed from the same figures agrees with it; a norm_eps of 1e308 zeroes every
    normalised activation (calctl.limits.NORM_EPS). So a package sealed by hand or by an older importer is held to the
    importer's limits: architecture.rope_theta and norm_eps, and the float values of the rope_freq_factors tensor
    (read from its verified file, once GOLD005/GOLD006 place it).
    """

    id = "GOLD009"
    sections = ("001 §6.1", "001 §6.2 item 6", "001 §13.1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            a = m.architecture
            wrong = limits.out_of_range("rope_theta", a.rope_theta)
            if wrong:
                yield self.manifest_problem(
                    f"model {m.alias!r}: rope_theta {wrong}",
                    field=f"{m.pointer}/architecture/rope_theta",
                    expected=f"{limits.ROPE_THETA.minimum:g}..{limits.ROPE_THETA.maximum:g}",
                    found=a.rope_theta,
                )
            wrong = limits.out_of_range("norm_eps", a.norm_eps)
            if wrong:
                yield self.manifest_problem(
                    f"model {m.alias!r}: norm_eps {wrong}",
                    field=f"{m.pointer}/architecture/norm_eps",
                    expected=f"{limits.NORM_EPS.minimum:g}..{limits.NORM_EPS.maximum:g}",
                    found=a.norm_eps,
                )
            n += 1
            if not a.rope_freq_factors:
                continue
            found = next(((i, t) for i, t in enumerate(m.params) if t.name == "rope_freq_factors"), None)
            if found is None:
                continue  # GOLD006 names the missing tensor
            i, t = found
            where = f"{m.pointer}/params/tensors/{i}"
            if t.dtype not in _FLOAT:  # the decoder divides by these values: an integer or block dtype is not one
                yield self.manifest_problem(
                    f"rope_freq_factors of {m.alias!r} is not a float tensor",
                    field=f"{where}/dtype",
                    expected="fp32 (or fp16, bf16)",
                    found=t.dtype,
                )
                continue
            values, reason = _small_float_tensor(ctx, t, a.head_dim // 2)
            if values is None:
                yield self.skip(f"rope_freq_factors of {m.alias!r} not read: {reason}", file=t.file, field=where)
                continue
            r = limits.ROPE_FACTOR
            bad = [
                (k, float(v)) for k, v in enumerate(values) if not (math.isfinite(v) and r.minimum <= v <= r.maximum)
            ]
            if bad:
                shown = ", ".join(f"[{k}] = {v!r}" for k, v in bad[:3]) + (
                    f" and {len(bad) - 3} more" if len(bad) > 3 else ""
                )
                yield self.problem(
                    f"rope_freq_factors of {m.alias!r}: {len(bad)} of {len(values)} per-pair divisors are not finite "
                    f"or outside the range of a {r.fact} (calctl.limits.{r.name}; {r.why}): {shown}",
                    file=t.file,
                    field=where,
                    expected=f"every value in {r.minimum:g}..{r.maximum:g}",
                    found=bad[0][1],
                )
        yield self.note(f"{n} models' RoPE figures and norm_eps are finite and in range")


def _small_float_tensor(ctx: ValidationContext, t: ParamTensor, count: int) -> tuple[np.ndarray | None, str]:
    """The values of a small float tensor of ``count`` elements as float64, read from its verified file; else why not."""
    gate = ctx.content_gate(t.file)
    if gate:
        return None, gate
    if tuple(t.shape) != (count,):
        return None, f"its shape {list(t.shape)} is not [{count}] (GOLD006)"
    assert ctx.root is not None
    try:
        with (ctx.root / t.file).open("rb") as fh:  # a regular file of the walk (content_gate): no FIFO, no link
            fh.seek(t.offset)
            raw = fh.read(t.nbytes)  # at most 4 x MAX_HEAD_DIM / 2 bytes: the shape was checked above
    except OSError as exc:
        return None, f"cannot read it ({exc.strerror or exc})"
    if len(raw) != t.nbytes:
        return None, "it runs past the end of its file (GOLD005)"
    if t.dtype in ("bf16", "bfloat16"):  # numpy has no bfloat16: widen the 16 bits
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(raw, dtype=np.dtype(NUMPY_DTYPE[t.dtype]).newbyteorder("<"))
    return values.astype(np.float64), ""


RULES: tuple[type[Rule], ...] = (
    GoldenFilesMatch,
    ContextLimits,
    VocabularyAgrees,
    GraphTensors,
    ParamTensorsInBounds,
    ArchitectureMatchesTensors,
    ToleranceDiscriminates,
    ReplicaWeightsEqual,
    RopeFiguresInRange,
)
