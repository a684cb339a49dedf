"""Package commands: keygen, sample-package, pack, sign, verify, inspect.

The libraries (the sample compiler with numpy, signing, the package reader) are
imported inside the commands, so a command's ``--help`` does not load them.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from calctl import textsafe
from calctl.cli import _output
from calctl.cli._options import AllowUnsignedOpt, FormatOpt, JobsOpt, TrustedKeyOpt, int_option
from calctl.cli._output import TableJson
from calctl.cli._package_arg import PackageArg, resolve_package
from calctl.errors import UsageError
from calctl.report import simple_report
from calctl.textsafe import markup as safe

if TYPE_CHECKING:
    from calctl.package.provenance import Staleness

#: Findings of one check (hash, signature) that `verify` prints; the rest are counted, JSON lists all.
MAX_SHOWN_PER_CHECK = 20
#: calctl.compiler.sample.KINDS, spelled out so --help needs no compiler (a unit test keeps them equal).
SAMPLE_KINDS = ("single", "combined", "replica")


def keygen(
    prefix: Annotated[Path, typer.Argument(help="Writes PREFIX.key (mode 0600) and PREFIX.pub; never overwrites.")],
    format: FormatOpt = TableJson.table,
) -> None:
    """Create an Ed25519 signing key pair for packages."""
    from calctl.signing import keys

    priv, pub = keys.generate(prefix)
    kid = keys.load_public(pub).key_id
    if _output.is_json(format):
        _output.emit_json(simple_report("keygen", {"private_key": str(priv), "public_key": str(pub), "key_id": kid}))
    else:
        _output.stdout.print(f"wrote {priv} (private, 0600) and {pub} (public); key id {kid}")


def sample_package(
    out: Annotated[Path, typer.Argument(help="Output directory (must not exist, or be empty).")],
    key: Annotated[Path, typer.Option("--key", help="PREFIX.key from `calctl keygen` that signs the package.")],
    kind: Annotated[str, typer.Option("--kind", help=f"One of: {', '.join(SAMPLE_KINDS)}.")] = "combined",
    seed: Annotated[
        int, int_option("--seed", min=0, max=2**31, help="Weight seed; same seed and key give byte-identical output.")
    ] = 0,
    profiles: Annotated[
        str,
        typer.Option("--profiles", help="Decode batch profiles, e.g. 1,4,8,16 (B>1 gets an inactive-lane contract)."),
    ] = "1",
    tar: Annotated[
        Path | None, typer.Option("--tar", help="Also write a deterministic tar of the package here.")
    ] = None,
    format: FormatOpt = TableJson.table,
) -> None:
    """Write a complete, valid, signed sample package for the mock device (the reference mock compiler)."""
    from calctl.compiler.sample import build_sample
    from calctl.package import archive
    from calctl.package import info as pkginfo
    from calctl.package.reader import load_manifest
    from calctl.signing import keys

    try:
        prof = tuple(textsafe.decimal_int(p) for p in profiles.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--profiles {profiles!r}: expected comma-separated integers such as 1,4,8") from None
    if tar is not None:
        from calctl.records import check_output

        check_output(tar, "--tar")  # before building: a FIFO or a device there is refused, never replaced
    private = keys.load_private(key)
    t0 = time.monotonic()
    path = build_sample(out, kind=kind, key=private, seed=seed, decode_profiles=prof or (1,))
    if tar:
        archive.write_tar(path, tar)
    pkg = load_manifest(path)
    doc = {
        "path": str(path),
        "kind": kind,
        "seed": seed,
        "aliases": list(pkg.aliases),
        "digest": pkginfo.package_digest(path),
        "signer_key_id": keys.key_id(private.public_key()),
        "tar": str(tar) if tar else None,
        "seconds": round(time.monotonic() - t0, 3),
    }
    if _output.is_json(format):
        _output.emit_json(simple_report("sample-package", doc))
    else:
        _output.stdout.print(
            f"wrote {kind} sample package {path} (models {', '.join(pkg.aliases)}; signed by {doc['signer_key_id']})"
            + (f" and {tar}" if tar else "")
        )


def pack(
    directory: Annotated[Path, typer.Argument(help="Package directory to seal.")],
    key: Annotated[Path, typer.Option("--key", help="PREFIX.key that signs checksums.sha256.")],
    out: Annotated[Path | None, typer.Option("--out", help="Also write a deterministic PKG.tar here.")] = None,
    refresh_provenance: Annotated[
        bool,
        typer.Option(
            "--refresh-provenance",
            help="Record a legitimate edit: recompute the build provenance's subjects from the files and note who "
            "resealed, when and with which key (the build's own record is kept).",
        ),
    ] = False,
    jobs: JobsOpt = None,
    format: FormatOpt = TableJson.table,
) -> int:
    """Seal a package: checksums.sha256 for every file, signed, optionally tarred.

    Writes checksums.sha256 for every file of DIRECTORY, signs it with --key, and with --out also writes a
    deterministic tar. A package edited after its build has stale provenance (validate: PROV002): pack says so
    (verdict WARN), and with --refresh-provenance records the edit in build-provenance.json before sealing.
    """
    from calctl.package import archive
    from calctl.package import info as pkginfo
    from calctl.package.reader import load_manifest
    from calctl.signing import keys, seal

    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory", hint="pack takes an unpacked package directory")
    private = keys.load_private(key)
    if out:
        archive.check_tar_destination(directory, out)  # before sealing: a failed pack changes nothing
    load_manifest(directory)  # refuse to seal something that is not a package at all
    kid = keys.key_id(private.public_key())
    refreshed, stale = _provenance_before_seal(directory, kid, refresh_provenance, jobs)
    with contextlib.ExitStack() as unsealed:
        if refreshed is not None:  # a failed pack changes nothing: the provenance as it was
            unsealed.callback((directory / "build-provenance.json").write_bytes, refreshed)
        kid = seal.seal(directory, private, jobs)
        unsealed.pop_all()
    if out:
        archive.write_tar(directory, out)
    listed = seal.parse_checksums((directory / "checksums.sha256").read_bytes())
    doc = {
        "package": str(directory),
        "files": len(listed),
        "signer_key_id": kid,
        "digest": pkginfo.package_digest(directory),
        "tar": str(out) if out else None,
        "provenance": _provenance_doc(refreshed is not None, stale),
    }
    verdict = "WARN" if stale and refreshed is None else "PASS"
    if _output.is_json(format):
        _output.emit_json(simple_report("pack", doc, verdict=verdict))
    else:
        _print_pack(directory, len(listed), kid, out, refreshed is not None, stale)
    return 0


def _provenance_before_seal(
    directory: Path, kid: str, refresh: bool, jobs: int | None
) -> tuple[bytes | None, Staleness | None]:
    """(the provenance's bytes before a refresh, or None; how it was stale, or None when it could not be read)."""
    from datetime import datetime, timezone

    from calctl.errors import PackageError
    from calctl.package import provenance

    path = directory / "build-provenance.json"
    if not path.is_file():
        if refresh:  # nothing to refresh: refused before anything is written
            raise PackageError(f"{path}: no such file; --refresh-provenance refreshes the build's provenance (LAY004)")
        return None, None  # LAY004 names a missing provenance; nothing to compare
    try:
        if not refresh:
            return None, provenance.staleness(directory, jobs)
        before = path.read_bytes()
        stale = provenance.refresh(
            directory, by=provenance.resealer(), at=datetime.now(timezone.utc), signer_key_id=kid, jobs=jobs
        )
        return before, stale
    except PackageError:
        if refresh:
            raise  # asked to refresh what cannot be read: refused, nothing changed
        return None, None


def _provenance_doc(refreshed: bool, stale: Staleness | None) -> dict[str, Any]:
    if stale is None:
        return {"status": "not compared"}
    status = "refreshed" if refreshed else ("stale" if stale else "current")
    return {
        "status": status,
        "changed": list(stale.changed),
        "not_named": list(stale.missing),
        "gone": list(stale.extra),
    }


def _print_pack(
    directory: Path, files: int, kid: str, out: Path | None, refreshed: bool, stale: Staleness | None
) -> None:
    tail = f"; wrote {out}" if out else ""
    if refreshed:
        what = f": {stale.describe()}" if stale else " (no subject had changed)"
        _output.stdout.print(
            f"refreshed build-provenance.json{escape(what)}; the reseal is recorded (who, when, key {kid})"
        )
    if stale and not refreshed:  # never "sealed, signed" as if the package were whole (#53 item 5)
        _output.stdout.print(
            f"{_output.styled_verdict('WARN')} sealed {escape(str(directory))}: {files} files, "
            f"signed by {kid}{escape(tail)}, but "
            f"build-provenance.json describes another build: {escape(stale.describe())}; validate fails PROV002. "
            "If the edit is legitimate, run again with --refresh-provenance to record it."
        )
        return
    _output.stdout.print(f"sealed {escape(str(directory))}: {files} files, signed by {kid}{escape(tail)}")


def sign(
    directory: Annotated[Path, typer.Argument(help="Package directory whose checksums.sha256 to sign.")],
    key: Annotated[Path, typer.Option("--key", help="PREFIX.key to sign with.")],
    format: FormatOpt = TableJson.table,
) -> None:
    """(Re-)sign an already packed package's checksums.sha256.

    E.g. with a release key after a build signed it with a development key.
    """
    from calctl.signing import keys, seal
    from calctl.signing.files import SIGNATURE

    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory")
    kid = seal.sign(directory, keys.load_private(key))
    if _output.is_json(format):
        _output.emit_json(
            simple_report("sign", {"package": str(directory), "signature": SIGNATURE, "signer_key_id": kid})
        )
    else:
        _output.stdout.print(f"signed {directory}/checksums.sha256 with key {kid}")


def verify(
    pkg: PackageArg = None,
    trusted_key: TrustedKeyOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    jobs: JobsOpt = None,
    format: FormatOpt = TableJson.table,
) -> int:
    """Check every hash and the signature (fast; no other validation).

    Exit 0 verified, 1 names each bad file or key, 2 usage.
    """
    from calctl.package.reader import package_root
    from calctl.signing import seal

    path, policy, _ = resolve_package(pkg, trusted_key, allow_unsigned)
    t0 = time.monotonic()
    with package_root(path) as root:
        report = seal.verify(root, list(policy.keys), jobs)
    elapsed = time.monotonic() - t0
    findings = list(report.findings)
    unsigned_only = findings and all(f.check == "signature" for f in findings) and report.hashes_ok
    ok = report.ok or (policy.allow_unsigned and unsigned_only)
    doc = {
        "package": str(path),
        "ok": bool(ok),
        "files_checked": report.files_checked,
        "bytes_hashed": report.bytes_hashed,
        "signer_key_id": report.signer.key_id if report.signer else None,
        "trusted_key_ids": list(policy.key_ids),
        "seconds": round(elapsed, 3),
        "findings": [
            {"check": f.check, "file": f.file, "message": f.message, "severity": "warning" if ok else "error"}
            for f in findings
        ],
    }
    result = simple_report("verify", doc, verdict=("WARN" if findings else "PASS") if ok else "FAIL")
    if _output.is_json(format):
        _output.emit_json(result)
    else:
        printed: dict[str, int] = {}
        for f in findings:
            printed[f.check] = printed.get(f.check, 0) + 1
            if printed[f.check] > MAX_SHOWN_PER_CHECK:
                if printed[f.check] == MAX_SHOWN_PER_CHECK + 1:
                    more = sum(1 for g in findings if g.check == f.check) - MAX_SHOWN_PER_CHECK
                    _output.stdout.print(f"[dim]... and {more:,} more {f.check} findings (--format json lists all)[/]")
                continue
            level = "[yellow]warning[/]" if ok else _output.styled_verdict("FAIL")
            _output.stdout.print(f"{level} {f.check}: {safe(f.file)}: {safe(f.message)}", highlight=False)
        if ok:
            who = (
                f"signed by {report.signer.key_id}"
                if report.signer
                else "UNSIGNED/UNTRUSTED (allowed by --allow-unsigned)"
            )
            _output.stdout.print(
                f"[green]verified[/] {safe(path)}: {report.files_checked} files, {report.bytes_hashed} bytes, "
                f"{who} ({elapsed:.2f}s)"
            )
        else:
            _output.stdout.print(f"[red]verification failed[/] for {safe(path)}: {len(findings)} problem(s)")
    return result.exit_code


def inspect(
    pkg: PackageArg = None,
    trusted_key: TrustedKeyOpt = None,
    format: FormatOpt = TableJson.table,
) -> None:
    """Show what a package contains: models, graphs, chips, memory plan, signer.

    Per graph its kind, chip mode, target chips, batch profiles, max_seq and ELF count; per chip the memory
    plan's regions; the files and the signer. The package is not validated: its manifest is read within the
    reader's limits (a manifest over them is exit 1), file contents are not hashed, and the output says so.
    """
    from calctl.package import info as pkginfo
    from calctl.package.reader import load_manifest, package_root

    path, policy, _ = resolve_package(pkg, trusted_key, False)
    with package_root(path) as root:
        doc = pkginfo.describe(load_manifest(root), policy)
    doc["package"]["path"] = str(path)
    if _output.is_json(format):
        _output.emit_json(simple_report("inspect", doc))
        return
    p = doc["package"]
    _output.stdout.print(f"[bold]{safe(p['name'])}[/] {safe(p['version'])} ({safe(p['kind'])}) at {safe(path)}")
    _output.stdout.print(
        f"digest sha256:{doc['digest']}  signer: {doc['signer_key_id'] or 'unknown (no trusted key verifies it)'}"
    )
    _output.stdout.print(
        f"{_output.styled_verdict('UNVERIFIED')}: inspect shows the manifest as written; file contents were not hashed and no "
        "validation rule ran (run `calctl verify` or `calctl validate` first)"
    )
    rows = []
    for m in doc["models"]:
        for g in m["graphs"]:
            rows.append(
                [
                    safe(m["alias"]),
                    safe(g["name"]),
                    safe(g["kind"]),
                    safe(g["chip_mode"]),
                    safe(g["target_chips"]),
                    safe(g["batch_profiles"]),
                    safe(g["max_seq"]),
                    len(g["programs"]),
                ]
            )
    _output.print_table(
        "Models and graphs", ["alias", "graph", "kind", "mode", "chips", "profiles", "max_seq", "ELFs"], rows
    )
    rows = []
    for c in doc["memory_plan"]:
        for r in c["regions"]:
            rows.append(
                [
                    c["chip"],
                    safe(r["name"]),
                    safe(r["kind"]),
                    safe(r["vaddr"]),
                    _output.mib(r["size"]),
                    "rw" if r["writable"] else "ro",
                ]
            )
        rows.append(
            [
                c["chip"],
                "[bold]total reserved[/]",
                "",
                "",
                _output.mib(c["reserved_bytes"]),
                f"of {_output.mib(c['dram_bytes'])} DRAM",
            ]
        )
    _output.print_table("Memory plan per chip", ["chip", "region", "kind", "vaddr", "size", "access"], rows)
    more = f" (listing stopped at {len(doc['files']):,} entries)" if doc["files_truncated"] else ""
    _output.stdout.print(
        f"{len(doc['files'])} files{more}, {_output.mib(doc['total_bytes'])} ({doc['total_bytes']:,} bytes)"
    )


def register(app: typer.Typer) -> None:
    app.command("keygen")(keygen)
    app.command("sample-package")(sample_package)
    app.command("pack")(pack)
    app.command("sign")(sign)
    app.command("verify")(verify)
    app.command("inspect")(inspect)
