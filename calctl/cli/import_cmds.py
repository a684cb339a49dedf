"""``calctl import hf|gguf`` and ``calctl combine``: the reference mock compiler for real checkpoints.

Thin: parse options, call :mod:`calctl.compiler.importer`, render the summary.
Exit 0 written; 2 bad input (a missing, truncated or unsupported checkpoint, a
bad option: the message names the file and what was expected); 1 an input
package of ``combine`` that does not verify. Nothing is left behind on failure.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from calctl.cli import _output
from calctl.cli._device import option_group
from calctl.cli._options import AllowUnsignedOpt, FormatOpt, TrustedKeyOpt, int_option
from calctl.cli._output import TableJson
from calctl.report import simple_report

if TYPE_CHECKING:  # the importer loads numpy, the model and cryptography: only when a command runs
    from calctl.compiler.importer import build

#: ``build.DEFAULT_SEQUENCES``, ``build.KEEP_BLOCKS`` and ``build.DEFAULT_PROFILES``, written out so that
#: ``--help`` imports no importer (a unit test keeps them equal).
DEFAULT_SEQUENCES = 4
KEEP_BLOCKS = "gguf"
DEFAULT_PROFILES = "1,2,4,8"

KeyOpt = Annotated[Path, typer.Option("--key", help="PREFIX.key from `calctl keygen` that signs the package.")]
AliasOpt = Annotated[
    str | None, typer.Option("--alias", help="Model alias (default: from the directory or file name).")
]
ChipOpt = Annotated[int, int_option("--chip", help="Chip the model runs on (0 or 1).")]
ContextOpt = Annotated[
    int | None,
    int_option("--context", help="Context cap for the KV plan (default: min(max_position_embeddings, 4096))."),
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="How the parameter blobs store weights: fp16 or fp32.")]
SequencesOpt = Annotated[int, int_option("--sequences", help="KV sequences (lanes) the KV region holds.")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Package name (default: ALIAS-hf / ALIAS-gguf).")]
ProfilesOpt = Annotated[
    str,
    typer.Option(
        "--profiles",
        help="Decode batch profiles, 1 plus any of 2,4,8,16,32 (B>1: one decode job serves up to B lanes; "
        "`calctl serve` uses them with a --scheduler-config that lists them).",
    ),
]


@dataclass(frozen=True)
class ImportArgs:
    """The options ``import hf`` and ``import gguf`` share, as given (``import_options`` fills it)."""

    alias: str | None = None
    chip: int = 0
    context: int | None = None
    sequences: int = DEFAULT_SEQUENCES
    profiles: str = DEFAULT_PROFILES
    name: str | None = None

    def options(self, default_alias_from: str, dtype: str) -> build.ImportOptions:
        """The importer's options (``--profiles`` parsed; the alias from ``default_alias_from`` unless given)."""
        from calctl.compiler.importer import build

        return build.ImportOptions(
            alias=self.alias or build.default_alias(default_alias_from),
            chip=self.chip,
            context=self.context,
            dtype=dtype,
            sequences=self.sequences,
            name=self.name,
            profiles=build.parse_profiles(self.profiles),
        )


IMPORT_DEFAULTS = ImportArgs()
import_options = option_group(
    "args",
    ImportArgs,
    {
        "alias": AliasOpt,
        "chip": ChipOpt,
        "context": ContextOpt,
        "sequences": SequencesOpt,
        "profiles": ProfilesOpt,
        "name": NameOpt,
    },
)


def _run(ck_reader: Any, source: Path, out: Path, key: Path, opts: build.ImportOptions, fmt: TableJson) -> None:
    from calctl.cli._progress import Heartbeat
    from calctl.compiler.importer import build
    from calctl.package import info as pkginfo
    from calctl.signing import keys

    private = keys.load_private(key)
    t0 = time.monotonic()
    build.check_options(opts)
    _output.info(escape(_plan_line(source, out)))
    with Heartbeat(f"import {source.name}"):
        ck = ck_reader(source)
        summary = build.import_checkpoint(out, ck, opts, private)
    summary["digest"] = pkginfo.package_digest(out)
    summary["signer_key_id"] = keys.key_id(private.public_key())
    summary["seconds"] = round(time.monotonic() - t0, 3)
    if _output.is_json(fmt):
        _output.emit_json(simple_report("import", summary))
        return
    _output.stdout.print(
        f"wrote {out}: {summary['family']} model {summary['alias']!r} on chip{summary['chip']} "
        f"({summary['parameters']:,} parameters, {summary['layers']} layers, {summary['dtype']}, context "
        f"{summary['context']}); golden: {summary['golden_prompt']!r}, {summary['golden_tokens']} tokens; "
        f"signed by {summary['signer_key_id']}",
        markup=False,
        highlight=False,
    )
    for note in summary["notes"]:
        _output.info(note)


def _plan_line(source: Path, out: Path) -> str:
    """What an import does and how long it takes, said before it starts (#53 item 5)."""
    files = [source] if source.is_file() else [p for p in source.iterdir() if p.is_file()] if source.is_dir() else []
    size = sum(p.stat().st_size for p in files) / 2**20
    return (
        f"import {source} ({size:,.1f} MiB) -> {out}: read the weights, compute the golden set with the reference "
        "forward pass, write the programs and parameters, seal; a 135M-parameter model takes 1–3 min on 2 idle cores "
        "(4.5 min beside other work at load 12)"
    )


@import_options
def import_hf(
    directory: Annotated[
        Path, typer.Argument(help="Hugging Face model directory (config.json, *.safetensors, tokenizer).")
    ],
    out: Annotated[Path, typer.Argument(help="Output package directory (must not exist, or be empty).")],
    key: KeyOpt,
    args: ImportArgs = IMPORT_DEFAULTS,
    dtype: DtypeOpt = "fp16",
    format: FormatOpt = TableJson.table,
) -> None:
    """Import a Hugging Face Llama / Qwen2 / Qwen3 checkpoint as a sealed single-model package."""
    from calctl.compiler.importer import build

    _run(build.read_hf, directory, out, key, args.options(directory.resolve().name, dtype), format)


@import_options
def import_gguf(
    file: Annotated[Path, typer.Argument(help="GGUF model file (llama.cpp).")],
    out: Annotated[Path, typer.Argument(help="Output package directory (must not exist, or be empty).")],
    key: KeyOpt,
    args: ImportArgs = IMPORT_DEFAULTS,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="How the parameter blobs store weights: gguf (Q4_0/Q4_1/Q8_0 kept as shipped, the rest fp16), "
            "fp16 or fp32 (dequantised).",
        ),
    ] = KEEP_BLOCKS,
    format: FormatOpt = TableJson.table,
) -> None:
    """Import a GGUF Llama / Qwen2 / Qwen3 model (its Q4_0/Q4_1/Q8_0 blocks kept) as a sealed single-model package."""
    from calctl.compiler.importer import build

    opts = args.options(file.name.removesuffix(".gguf"), dtype)
    reader = functools.partial(build.read_gguf_file, keep_blocks=dtype == build.KEEP_BLOCKS)
    _run(reader, file, out, key, opts, format)


def combine(
    package_a: Annotated[Path, typer.Argument(help="Single-model package for chip 0.")],
    package_b: Annotated[Path, typer.Argument(help="Single-model package for chip 1 (the same model: a replica).")],
    out: Annotated[Path, typer.Argument(help="Output package directory (must not exist, or be empty).")],
    key: KeyOpt,
    alias_a: Annotated[str | None, typer.Option("--alias-a", help="Alias of the chip-0 model.")] = None,
    alias_b: Annotated[str | None, typer.Option("--alias-b", help="Alias of the chip-1 model.")] = None,
    name: NameOpt = None,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    format: FormatOpt = TableJson.table,
) -> None:
    """Make a combined (two models, one per chip) or replica (one model on both chips) package."""
    from calctl.compiler.importer.combine import combine as combine_packages
    from calctl.compiler.importer.combine import open_source
    from calctl.package import info as pkginfo
    from calctl.signing import keys
    from calctl.signing.policy import make_policy

    private = keys.load_private(key)
    policy = make_policy(trusted_key, allow_unsigned)
    a = open_source(package_a, list(policy.keys), allow_unsigned)
    b = open_source(package_b, list(policy.keys), allow_unsigned)
    doc = combine_packages(out, a, b, private, alias_a=alias_a, alias_b=alias_b, name=name)
    doc["digest"] = pkginfo.package_digest(out)
    if _output.is_json(format):
        _output.emit_json(simple_report("combine", doc))
        return
    _output.stdout.print(
        f"wrote {doc['kind']} package {out}: {doc['aliases'][0]} on chip0, {doc['aliases'][1]} on chip1",
        markup=False,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    import_app = typer.Typer(
        help="Import a real checkpoint (Hugging Face or GGUF) as a sealed package the mock can run.",
        no_args_is_help=True,
    )
    import_app.command("hf")(import_hf)
    import_app.command("gguf")(import_gguf)
    app.add_typer(import_app, name="import")
    app.command("combine")(combine)
