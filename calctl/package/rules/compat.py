"""Compatibility and provenance rules (COMP, PROV).

compatibility.json is the version matrix and ELF machine description (001
§15.1 item 5, §15.2 item 10); build-provenance.json is an in-toto Statement
whose subjects bind every package file to the build (§15.1 item 5, §12 Phase 0
item 1). Asking a device for its runtime version is the runtime layer's job;
here the version comes from the caller (``--runtime-version``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from calctl.package.model import COMPATIBILITY, PROVENANCE
from calctl.package.rules.base import Finding, Need, Rule
from calctl.package.rules.context import JsonState, ValidationContext

_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,3}$")


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"0.7.6"`` -> ``(0, 7, 6)``; None for anything else (no pre-release tags: exact ranges only)."""
    if not isinstance(text, str) or not _VERSION.match(text):
        return None
    parts = tuple(int(p) for p in text.split("."))
    return parts + (0,) * (4 - len(parts))


def _json_findings(rule: Rule, state: JsonState, name: str, schema: str) -> Iterator[Finding]:
    if state.parse_error:
        yield rule.problem(state.parse_error.removeprefix(f"{name}: "), file=name)
        return
    for pointer, message in state.schema_errors:
        yield rule.problem(f"schema {schema}: {message}", file=name, field=pointer)


class CompatibilityValid(Rule):
    """compatibility.json is schema-valid, its ranges are non-empty and it agrees with device_cfg.

    The compatibility matrix (001 §15.1 item 5, §15.2 item 10) is schema calculet-compatibility/v1: runtime (and
    optional driver/firmware) version ranges [min, max_exclusive), the compiler, the ELF class/data/machine the CalCores
    run (with machine_name, when given, naming that e_machine), and the device shape. Every range must be non-empty, and
    device.chip_nums / calcore_num must equal the manifest's device_cfg.
    """

    id = "COMP001"
    sections = ("001 §15.1 item 5", "001 §15.2 item 10", "001 §12 Phase 0 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        state = ctx.compatibility
        problems = list(_json_findings(self, state, COMPATIBILITY, "calculet-compatibility/v1"))
        yield from problems
        if problems or state.doc is None:
            return
        doc = state.doc
        for key in ("runtime", "driver", "firmware"):
            rng = doc.get(key)
            if rng is None:
                continue
            lo, hi = parse_version(rng["min"]), parse_version(rng["max_exclusive"])
            if lo is not None and hi is not None and not lo < hi:
                yield self.problem(
                    f"{key} range is empty",
                    file=COMPATIBILITY,
                    field=f"/{key}",
                    expected="min < max_exclusive",
                    found=f"[{rng['min']}, {rng['max_exclusive']})",
                )
        elf = doc["elf"]
        name = elf.get("machine_name")
        if name is not None:
            from elftools.elf.enums import ENUM_E_MACHINE

            number = ENUM_E_MACHINE.get(name)
            if isinstance(number, int) and number != elf["machine"]:
                yield self.problem(
                    "machine_name names another e_machine",
                    file=COMPATIBILITY,
                    field="/elf/machine_name",
                    expected=f"{name} = {number}",
                    found=elf["machine"],
                )
        pkg = ctx.package
        if pkg is None:
            yield self.skip("device agreement not checked: manifest failed MAN001", file=COMPATIBILITY, field="/device")
        else:
            dev = doc["device"]
            for key in ("chip_nums", "calcore_num"):
                if dev[key] != getattr(pkg.device_cfg, key):
                    yield self.problem(
                        f"device.{key} disagrees with the manifest device_cfg",
                        file=COMPATIBILITY,
                        field=f"/device/{key}",
                        expected=getattr(pkg.device_cfg, key),
                        found=dev[key],
                    )
        rt = doc["runtime"]
        yield self.note(
            f"valid; runtime {rt.get('name', 'CalRT')} [{rt['min']}, {rt['max_exclusive']}), ELF machine {elf['machine']}"
        )


class RuntimeVersion(Rule):
    """The runtime version in use (--runtime-version) is within compatibility.json's runtime range.

    Driver, firmware, CalRT, compiler and calbin versions are frozen together (001 Phase 0 item 1) and concurrency
    behaviour changed across CalRT commits (§20), so a package runs only on a runtime version in [runtime.min,
    runtime.max_exclusive). The version comes from --runtime-version (or, for device commands, from the device). Without
    it the rule passes and states the accepted range.
    """

    id = "COMP002"
    needs = frozenset({Need.ROOT, Need.COMPATIBILITY})
    sections = ("001 §12 Phase 0 item 1", "001 §15.2 item 10", "001 §20")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        doc: dict[str, Any] | None = ctx.compatibility.doc
        assert doc is not None
        rt = doc["runtime"]
        span = f"[{rt['min']}, {rt['max_exclusive']})"
        given = ctx.policy.runtime_version
        if given is None:
            yield self.note(f"not requested (--runtime-version); the package accepts runtime {span}")
            return
        v, lo, hi = parse_version(given), parse_version(rt["min"]), parse_version(rt["max_exclusive"])
        if v is None:
            yield self.problem(
                f"runtime version {given!r} is not a dotted version",
                field="--runtime-version",
                expected="e.g. 0.7.6",
                found=given,
            )
            return
        if lo is None or hi is None or not lo <= v < hi:
            yield self.problem(
                f"runtime {given} is outside the package's supported range",
                file=COMPATIBILITY,
                field="/runtime",
                expected=span,
                found=given,
            )
            return
        yield self.note(f"runtime {given} within {span}")


class ProvenanceValid(Rule):
    """build-provenance.json is a schema-valid in-toto Statement with a SLSA provenance predicate.

    Each package ships its compiler container/commit and full command (001 §15.1 item 5) as build-provenance.json: an
    in-toto Statement v1 with a SLSA provenance v1 predicate, valid against build-provenance/v1.
    """

    id = "PROV001"
    sections = ("001 §15.1 item 5", "001 §12 Phase 0 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        yield from _json_findings(self, ctx.provenance, PROVENANCE, "build-provenance/v1")
        yield self.note("valid in-toto Statement v1 / SLSA provenance v1")


class ProvenanceSubjects(Rule):
    """Provenance subjects cover every sealed file but itself, once each, with the digests in checksums.sha256.

    The build statement must be about exactly this package: its subjects name every file listed in checksums.sha256
    except build-provenance.json itself, each once, with the same SHA-256. A subject missing, extra or with another
    digest means the provenance describes a different build.
    """

    id = "PROV002"
    needs = frozenset({Need.ROOT, Need.PROVENANCE, Need.CHECKSUMS})
    sections = ("001 §15.1 item 5", "001 §12 Phase 0 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        doc = ctx.provenance.doc
        listed = ctx.checksums.listed
        assert doc is not None and listed is not None
        seen: dict[str, int] = {}
        for i, subject in enumerate(doc["subject"]):
            name, digest = subject["name"], subject["digest"]["sha256"]
            where = f"/subject/{i}"
            if name in seen:
                yield self.problem(
                    f"subject {name!r} appears twice (also /subject/{seen[name]})", file=PROVENANCE, field=where
                )
                continue
            seen[name] = i
            if name == PROVENANCE:
                yield self.problem("the provenance names itself as a subject", file=PROVENANCE, field=where)
            elif name not in listed:
                yield self.problem(f"subject {name!r} is not a file of the package", file=PROVENANCE, field=where)
            elif listed[name] != digest:
                yield self.problem(
                    f"subject {name!r} digest differs from checksums.sha256",
                    file=PROVENANCE,
                    field=f"{where}/digest/sha256",
                    expected=listed[name],
                    found=digest,
                )
        for name in listed:
            if name != PROVENANCE and name not in seen:
                yield self.problem(f"file {name!r} is not a provenance subject", file=PROVENANCE, field="/subject")
        yield self.note(f"{len(seen)} subjects match checksums.sha256")


RULES: tuple[type[Rule], ...] = (CompatibilityValid, RuntimeVersion, ProvenanceValid, ProvenanceSubjects)
