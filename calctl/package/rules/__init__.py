"""The validation rules of ``calctl validate``: one module per group, one explicit registry.

:data:`RULES` lists every rule class in report order. It is written out by
hand (not discovered) so the set of checks is reviewable in one place and a
rule can never silently drop out of a report. IDs are stable: a rule may be
reworded or tightened, never renumbered; a retired ID is not reused.

This package checks; it does not print, pick exit codes or load trust stores
(see :mod:`calctl.package.validate` and :mod:`calctl.cli.validate_cmds`).
"""

from __future__ import annotations

from calctl.package.rules import (
    chipmask,
    compat,
    elf,
    finite,
    hashes,
    layout,
    manifest,
    memory,
    signature,
    tensors,
    tokenizer,
)
from calctl.package.rules.base import Group, Rule, Severity, Status

RULES: tuple[type[Rule], ...] = (
    *layout.RULES,  # LAY001-LAY008
    *manifest.RULES,  # MAN001-MAN009
    *hashes.RULES,  # HASH001-HASH002
    *signature.RULES,  # SIG001-SIG002
    *chipmask.RULES,  # CHIP001-CHIP008
    *elf.RULES,  # ELF001-ELF006
    *memory.RULES,  # MEM001-MEM009
    *tensors.RULES,  # GOLD001-GOLD009
    *finite.RULES,  # GOLD010
    *tokenizer.RULES,  # TOK001-TOK004
    *compat.RULES,  # COMP001-COMP002, PROV001-PROV002
)

_BY_ID = {r.id: r for r in RULES}
if len(_BY_ID) != len(RULES):  # pragma: no cover - a programming error caught at import
    raise RuntimeError("duplicate rule id in calctl.package.rules.RULES")


def rule_by_id(rule_id: str) -> type[Rule] | None:
    """The rule with exactly this ID (case-insensitive), or None."""
    return _BY_ID.get(rule_id.strip().upper())


__all__ = ["RULES", "Group", "Rule", "Severity", "Status", "rule_by_id"]
