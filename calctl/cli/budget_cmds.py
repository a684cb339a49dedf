"""``calctl budget``: per-chip capacity plan and GO/NO-GO (001 §8, gate G0).

Parses options, builds a plan from a package or a Hugging Face config with
:mod:`calctl.budget`, renders it. All arithmetic and every rule live in the
library; this module only turns options into arguments and results into a table
or the JSON document. Exit 0 GO, 1 NO-GO, 2 bad input (errors raise; ``app.py``
maps them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from calctl import limits, textsafe
from calctl.cli import _output
from calctl.cli._options import AllowUnsignedOpt, FormatOpt, TrustedKeyOpt, float_option, int_option
from calctl.cli._output import TableJson
from calctl.cli._package_arg import PackageArg, resolve_package
from calctl.errors import CheckFailed, UsageError

if TYPE_CHECKING:  # calctl.budget loads the package model, the rules and jsonschema: only when budget runs
    from calctl.budget.evaluation import BudgetReport
    from calctl.budget.plan import BudgetPlan, ChipBudget, WorkspaceOverride
    from calctl.package.validate import ValidationReport
    from calctl.signing.policy import TrustPolicy

#: The option bounds (the one table, :mod:`calctl.limits`, which imports nothing) and the dtypes of
#: :mod:`calctl.budget` (``units.OPTION_DTYPES``, written out so that ``calctl budget --help`` imports no
#: library; a unit test keeps them equal).
MAX_CONTEXT = limits.MAX_CONTEXT.maximum
MAX_SEQUENCES = limits.MAX_SEQUENCES.maximum
OPTION_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4", "fp32")

_DTYPES = ", ".join(OPTION_DTYPES)

HfConfigOpt = Annotated[
    Path | None,
    typer.Option("--hf-config", help="Budget a Hugging Face config.json instead of a package (weights estimated)."),
]
ContextOpt = Annotated[
    int | None,
    int_option(
        "--context",
        min=1,
        max=MAX_CONTEXT,
        help="Tokens per sequence. Default: the model's context limit, a package's context_limit or a "
        "config's max_position_embeddings value.",
    ),
]
BatchOpt = Annotated[
    int | None,
    int_option(
        "--batch",
        min=1,
        max=MAX_SEQUENCES,
        help="Active sequences. Default: the package's kv.max_sequences; 1 for a config (001 §8.3 B1).",
    ),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help=f"Weight dtype for the config estimate, one of {_DTYPES} (int4 = 0.5 byte). Default: the config's torch_dtype.",
    ),
]
KvDtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--kv-dtype", help=f"KV cache dtype, one of {_DTYPES}. Default: manifest kv.dtype / config torch_dtype."
    ),
]
ChipsOpt = Annotated[
    int | None,
    int_option(
        "--chips",
        min=1,
        max=32,
        help="Config only: split weights and KV heads tensor-parallel over N chips (KV heads by ceiling division).",
    ),
]
BlockOpt = Annotated[
    int | None,
    int_option(
        "--block-tokens",
        min=1,
        max=1 << 16,
        help="KV block (page) size in tokens for layout rounding. Default: manifest kv.block_tokens; none for a config.",
    ),
]
SizeOpt = str | None


def budget(
    pkg: PackageArg = None,
    hf_config: HfConfigOpt = None,
    context: ContextOpt = None,
    batch: BatchOpt = None,
    dtype: DtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    chips: ChipsOpt = None,
    chip_dram: Annotated[
        SizeOpt,
        typer.Option(
            "--chip-dram",
            help="Local DRAM of ONE chip, e.g. 16GiB (never the board total). Default: manifest "
            "device_cfg; 16GiB for a config.",
        ),
    ] = None,
    workspace: Annotated[
        SizeOpt, typer.Option("--workspace", help="Peak workspace per chip, e.g. 512MiB (replaces both phases).")
    ] = None,
    prefill_workspace: Annotated[SizeOpt, typer.Option("--prefill-workspace", help="Prefill peak workspace.")] = None,
    decode_workspace: Annotated[SizeOpt, typer.Option("--decode-workspace", help="Decode peak workspace.")] = None,
    block_tokens: BlockOpt = None,
    limit: Annotated[
        float, float_option("--limit", help="Static budget ceiling as a fraction of chip DRAM (001 §8.2: 0.75-0.80).")
    ] = 0.80,
    guard_fraction: Annotated[
        float, float_option("--guard-fraction", help="Reserve kept free, as a fraction of chip DRAM.")
    ] = 0.15,
    guard_min: Annotated[str, typer.Option("--guard-min", help="Smallest reserve kept free.")] = "1GiB",
    grid: Annotated[bool, typer.Option("--grid", help="Also print a context x batch what-if table.")] = False,
    grid_contexts: Annotated[
        str | None, typer.Option("--grid-contexts", help="Grid contexts, e.g. 4096,8192,32768 (implies --grid).")
    ] = None,
    grid_batches: Annotated[
        str | None, typer.Option("--grid-batches", help="Grid batches, e.g. 1,4,8 (implies --grid).")
    ] = None,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    format: FormatOpt = TableJson.table,
) -> int:
    """Per-chip capacity plan and GO/NO-GO (001 §8, gate G0).

    M_required per chip by the 001 §8.1 formula, judged by the 001 §8.2 policy. Budgets a package
    (default: the bundled combined sample) chip by chip with the model(s) on each chip, or a Hugging Face
    config.json with --hf-config. A package is validated first, with the same trust options as the runners
    (a package that fails validation gets no plan: exit 1; --allow-unsigned lets a draft be planned,
    reported as a warning).
    Exit 0 GO on every chip, 1 NO-GO or refused, 2 bad input.
    """
    from calctl.budget import units
    from calctl.budget.evaluation import report_document, run_budget
    from calctl.budget.policy import BudgetPolicy, check_fraction
    from calctl.report import simple_report

    policy = BudgetPolicy(
        limit=check_fraction(limit, "--limit", zero_ok=False, one_ok=True),
        guard_fraction=check_fraction(guard_fraction, "--guard-fraction", zero_ok=True, one_ok=False),
        guard_min_bytes=units.parse_size(guard_min, "--guard-min"),
    )
    dram = units.parse_size(chip_dram, "--chip-dram", allow_zero=False) if chip_dram is not None else None
    ws = _workspace(workspace, prefill_workspace, decode_workspace)
    kv_dt = units.canonical_dtype(kv_dtype, "--kv-dtype", units.OPTION_DTYPES) if kv_dtype is not None else None
    w_dt = units.canonical_dtype(dtype, "--dtype", units.OPTION_DTYPES) if dtype is not None else None
    axes_c = _int_list(grid_contexts, "--grid-contexts", MAX_CONTEXT)
    axes_b = _int_list(grid_batches, "--grid-batches", MAX_SEQUENCES)

    def run(plan: BudgetPlan) -> BudgetReport:
        return run_budget(
            plan, policy, context=context, sequences=batch, grid=grid, grid_contexts=axes_c, grid_sequences=axes_b
        )

    validation: ValidationReport | None = None
    if hf_config is not None:
        if trusted_key or allow_unsigned:
            raise UsageError("--trusted-key/--allow-unsigned apply to a package, not to --hf-config")
        if pkg is not None:
            raise UsageError("give a package or --hf-config, not both")
        report = run(_config_plan(hf_config, chips or 1, dram, w_dt, kv_dt, block_tokens, ws))
    else:
        if chips is not None:
            raise UsageError("--chips applies to --hf-config; a package's manifest places its models on chips")
        if w_dt is not None:
            raise UsageError("--dtype applies to --hf-config; a package states its compiled weights (W_compiled)")
        path, trust, _ = resolve_package(pkg, trusted_key, allow_unsigned)
        validation = _validated(path, trust)
        report = _package_budget(path, validation, run, dram, kv_dt, block_tokens, ws)

    doc = report_document(report)
    if validation is not None:
        doc["validation"] = _validation_doc(validation)
    result = simple_report("budget", {k: v for k, v in doc.items() if k != "verdict"}, verdict=report.verdict.value)
    if _output.is_json(format):
        _output.emit_json(result)
    else:
        _render(report)
    return result.exit_code


def _workspace(workspace: str | None, prefill: str | None, decode: str | None) -> WorkspaceOverride:
    """--workspace (both phases' peak) or --prefill-workspace/--decode-workspace, never both."""
    from calctl.budget import units
    from calctl.budget.plan import WorkspaceOverride

    if workspace is not None and (prefill is not None or decode is not None):
        raise UsageError(
            "--workspace sets the peak itself; give it or --prefill-workspace/--decode-workspace, not both"
        )
    return WorkspaceOverride(
        peak_bytes=units.parse_size(workspace, "--workspace") if workspace is not None else None,
        prefill_bytes=units.parse_size(prefill, "--prefill-workspace") if prefill is not None else None,
        decode_bytes=units.parse_size(decode, "--decode-workspace") if decode is not None else None,
    )


def _config_plan(
    hf_config: Path,
    chips: int,
    dram: int | None,
    w_dt: str | None,
    kv_dt: str | None,
    block_tokens: int | None,
    ws: WorkspaceOverride,
) -> BudgetPlan:
    """The plan of a Hugging Face config.json (weights estimated)."""
    from calctl.budget.builders import plan_from_config
    from calctl.budget.shape import load_hf_config

    return plan_from_config(
        load_hf_config(hf_config),
        path=str(hf_config),
        chips=chips,
        chip_dram_bytes=dram,
        weight_dtype=w_dt,
        kv_dtype=kv_dt,
        block_tokens=block_tokens,
        workspace=ws,
    )


def _package_budget(
    path: Path,
    validation: ValidationReport,
    run: Callable[[BudgetPlan], BudgetReport],
    dram: int | None,
    kv_dt: str | None,
    block_tokens: int | None,
    ws: WorkspaceOverride,
) -> BudgetReport:
    """The budget of the validated package at ``path``, refused if its checksums changed since validation."""
    from calctl.budget.builders import plan_from_package
    from calctl.package.info import package_digest
    from calctl.package.reader import load_manifest, package_root

    with package_root(path) as root:
        if package_digest(root) != validation.digest:
            raise CheckFailed(
                f"{path}: checksums.sha256 changed between validation and planning",
                hint="something is writing to the package; copy it somewhere read-only",
            )
        plan = plan_from_package(
            load_manifest(root), chip_dram_bytes=dram, kv_dtype=kv_dt, block_tokens=block_tokens, workspace=ws
        )
        return run(plan)


def _validation_doc(validation: ValidationReport) -> dict[str, Any]:
    """The ``validation`` object of budget's JSON report."""
    return {
        "ok": validation.ok,
        "digest": validation.digest,
        "signer_key_id": validation.signer_key_id,
        "warnings": [{"id": c.id, "file": c.file, "message": c.message} for c in validation.warnings],
    }


def _validated(path: Path, trust: TrustPolicy) -> ValidationReport:
    """docs/validate.md: every command that reads a package validates it first; a refused package gets no plan."""
    from calctl.package.validate import ValidationPolicy, validate

    validation = validate(path, ValidationPolicy(trust=trust))
    if not validation:
        raise CheckFailed(
            f"{path}: the package failed validation ({', '.join(validation.failed_ids()) or 'policy'}); "
            "no budget is computed for a package that would never be loaded",
            hint=f"run `calctl validate {path}` for every finding",
        )
    for c in validation.warnings:
        _output.info(f"[yellow]warning[/] {escape(c.id)}: {escape(c.file + ': ' if c.file else '')}{escape(c.message)}")
    return validation


def _int_list(text: str | None, what: str, ceiling: int) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(textsafe.decimal_int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected comma-separated integers such as 1,4,8") from None
    if not values or any(not 1 <= v <= ceiling for v in values):
        raise UsageError(f"{what} {text!r}: every value must be between 1 and {ceiling}")
    return tuple(sorted(set(values)))


# ---------------------------------------------------------------------------
# Rendering for people


def _size(value: int) -> str:
    """Bytes over GiB in one cell: two short lines keep the table inside 80 columns."""
    from calctl.budget import units

    return f"{value:,}\n{units.gib(value)} GiB"


def _row(budget: ChipBudget, name: str, value: int, source: str, detail: str) -> list[str]:
    from calctl.budget import units

    return [
        escape(name),
        _size(value),
        units.percent(value, budget.dram_bytes),
        escape(source),
        escape(detail),
    ]


def _render(report: BudgetReport) -> None:
    from calctl.budget import units
    from calctl.budget.policy import BudgetVerdict

    out = _output.stdout
    inp = report.input
    what = f"{inp.name} {inp.version}" if inp.version else inp.name
    out.print(f"[bold]budget[/] {escape(what)} ({inp.kind} {escape(inp.path)})")
    for m in report.models:
        out.print(
            f"  {escape(m.alias)}: chips {list(m.chips)}, context {m.context:,}, {m.sequences} active sequence(s), "
            f"weights {m.weight_dtype}, KV {m.kv_dtype}; KV {units.gib(m.kv_bytes)} GiB for the whole model "
            f"({m.kv_bytes:,} bytes, {m.kv_bytes_per_token:,} bytes/token)"
        )
    p = report.policy
    out.print(
        f"  policy: static <= {units.fraction(p.limit)} of chip DRAM and reserve >= "
        f"max({units.human(p.guard_min_bytes)}, {units.fraction(p.guard_fraction)} of chip DRAM), "
        "each chip on its own (001 §8.2)"
    )

    for chip in report.chips:
        b = chip.budget
        rows = [_row(b, c.name, c.bytes, c.source.value, c.detail) for c in b.components if c.name != "safety_guard"]
        rows.append(
            [
                "[bold]static[/]",
                _size(b.static_bytes),
                units.percent(b.static_bytes, b.dram_bytes),
                "",
                f"must be <= {units.gib(b.usable_bytes)} GiB usable",
            ]
        )
        guard = b.component("safety_guard")
        rows.append(_row(b, guard.name, guard.bytes, guard.source.value, guard.detail))
        rows.append(
            [
                "[bold]M_required[/]",
                _size(b.required_bytes),
                units.percent(b.required_bytes, b.dram_bytes),
                "",
                "static + safety_guard, must be <= DRAM",
            ]
        )
        title = (
            f"chip {b.chip} ({escape(', '.join(b.models)) or 'no model'}): "
            f"DRAM {units.gib(b.dram_bytes)} GiB, limit {units.gib(b.limit_bytes)} GiB"
        )
        _output.print_table(title, ["component", "bytes / GiB", "% DRAM", "source", "detail"], rows)
        out.print(f"  {_output.styled_verdict(b.verdict.value)} chip {b.chip}: " + escape("; ".join(b.reasons)))
        for note in b.notes:
            out.print(f"  [yellow]note[/]: {escape(note)}")
        if chip.max_context is not None and chip.max_sequences is not None:
            lanes = [m.sequences for m in report.models if b.chip in m.chips]
            out.print(
                f"  largest context at the given batch: {chip.max_context.value:,} "
                f"({chip.max_context.bound.value}); largest batch at the given context: "
                f"{chip.max_sequences.value:,} ({chip.max_sequences.bound.value})"
            )
            out.print(f"  [dim]{_what_if_note(lanes)}[/]")

    if report.grid is not None:
        g = report.grid
        rows = []
        for row in g.cells:
            rows.append(
                [f"{row[0].context:,}"]
                + [f"{_output.styled_verdict(c.verdict.value)} {units.gib(c.static_bytes)}" for c in row]
            )
        _output.print_table(
            "what-if: verdict and static GiB of the tightest chip (rows: context, columns: batch)",
            ["context"] + [f"batch {s}" for s in g.sequences],
            rows,
        )

    if report.assumptions:
        out.print("[bold]assumptions[/]")
        for a in report.assumptions:
            out.print(f"  - {escape(a)}")
    mc = report.max_context
    ms = report.max_sequences
    if mc is not None and ms is not None:
        tight = [c.budget.chip for c in report.chips if c.max_sequences is not None and c.max_sequences == ms]
        where = f"the tightest chip, chip {tight[0]}" if tight else "the tightest chip"
        out.print(
            f"largest context at the given batch: [bold]{mc.value:,}[/] ({mc.bound.value}); "
            f"largest batch at the given context: [bold]{ms.value:,}[/] ({ms.bound.value}), on {where}"
        )
        out.print(f"[dim]{_what_if_note([m.sequences for m in report.models])}[/]")
    failing = [str(c.budget.chip) for c in report.chips if c.budget.verdict is not BudgetVerdict.GO]
    where = f"chip {', '.join(failing)} over budget" if failing else "every chip within budget"
    out.print(f"verdict {_output.styled_verdict(report.verdict.value)}: {where}")


def _what_if_note(lanes: list[int]) -> str:
    """Why "largest batch 98,985" for a package with 16 lanes: it is what memory alone would allow."""
    served = f"{max(lanes)} lane(s)" if lanes else "its compiled lanes"
    return (
        f"(memory what-ifs: what this chip's DRAM alone would hold; the package itself serves at most {served}, "
        "its kv.max_sequences, and its context_limit)"
    )


def register(app: typer.Typer) -> None:
    app.command("budget")(budget)
