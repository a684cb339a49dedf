"""000 §11 steps 2–4 and 8's static half for one package, before anything touches the board.

Validate (signature, hashes, static rules), cross-check the serving configuration, check the package
fits the device and plan its capacity; the result is each alias's scheduler settings. Outside the
lifecycle lock: the served generation keeps serving while a reload is checked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from calctl.budget import BudgetPolicy, BudgetVerdict, max_kv_tokens, max_sequences, run_budget
from calctl.budget.builders import plan_from_package
from calctl.budget.device import device_fit
from calctl.errors import CheckFailed
from calctl.package.model import Package
from calctl.package.validate import ValidationPolicy, validate
from calctl.runtime.interface import Runtime
from calctl.serving.config import (
    DualModelConfig,
    SchedulerConfig,
    check_served_package,
    cross_check_dual_model,
    cross_check_scheduler,
    default_scheduler_config,
    scheduler_settings,
)
from calctl.serving.core.settings import SchedulerSettings
from calctl.serving.engine.options import LoadedPackage, LoadPolicy
from calctl.signing.policy import TrustPolicy

log = logging.getLogger("calctl.serve")

#: The bundled sample compiler's decoder: its weights are random, so its text is noise by design.
_RANDOM_WEIGHTS_FAMILY = "calctl-tiny-decoder"


def _log_package_notes(lp: LoadedPackage, warnings: tuple[Any, ...]) -> None:
    """Say what a served package is, as the runners do: its validation warnings (SIG002, the published
    test-only key, among them) and, once per load, that a sample model's random weights answer with noise."""
    for w in warnings:
        where = f" ({w.file})" if w.file else ""
        log.warning("%s: %s%s: %s", lp.source, w.id, where, w.message)
    noise = [m.alias for m in lp.package.models if m.architecture.family == _RANDOM_WEIGHTS_FAMILY]
    if noise:
        log.warning(
            "%s: %s %s random weights (the sample compiler's tiny decoder): expect noise, not text, in every "
            "answer; README.md 'A real model, offline: SmolLM2-135M-Instruct' serves a real model",
            lp.source,
            ", ".join(noise),
            "has" if len(noise) == 1 else "have",
        )


@dataclass
class LoadCheck:
    """What a package is checked against: the runtime, the trust policy and the serving configuration."""

    rt: Runtime
    trust: TrustPolicy
    dual_config: DualModelConfig | None
    scheduler_configs: dict[str, SchedulerConfig]
    budget_policy: BudgetPolicy
    load_policy: LoadPolicy

    def check(self, lp: LoadedPackage) -> dict[str, SchedulerSettings]:
        """Steps 2–4 and 8's static half: validate, cross-check the config, plan capacity. Outside the lock.
        Returns each alias's scheduler settings (its capacity from the plan)."""
        # 001 §10.4: the configuration names the package it serves; another one fails before anything runs.
        check_served_package(self.dual_config, lp.source, lp.digest, pinned=self.load_policy.pinned_digest)
        for cfg in self.scheduler_configs.values():  # standalone calculet-scheduler/v1 files (--scheduler-config)
            cross_check_scheduler(cfg, lp.package)
        expect = tuple(m.alias for m in self.dual_config.models) if self.dual_config else None
        profiles = tuple(sorted({p for c in self.configs(lp.package).values() for p in c.batch.profiles}))
        report = validate(
            lp.root,
            ValidationPolicy(
                trust=self.trust, expect_models=expect, profiles=profiles, runtime_version=self.rt.versions().runtime
            ),
        )
        if not report:
            raise CheckFailed(  # rule, file and figure, as every command says a refusal (#53 item 6)
                f"{lp.source}: package failed validation ({report.refusal()})",
                hint=f"run `calctl validate {lp.source}`",
            )
        _log_package_notes(lp, report.warnings)
        if self.dual_config:
            cross_check_dual_model(self.dual_config, lp.package)
        topo = self.rt.topology()
        fit = device_fit(lp.package, topo)
        if not fit.ok:  # before configure: a package that does not fit the board never reaches it
            raise CheckFailed(
                f"{lp.source}: the package does not fit the device: {fit.summary()}",
                hint=f"run `calctl budget {lp.source}` and `calctl device info`",
            )
        dram = next((d for d in topo.dram_bytes if d), lp.package.device_cfg.chip_dram_bytes)
        budget = run_budget(plan_from_package(lp.package, chip_dram_bytes=dram), self.budget_policy)
        if budget.verdict is not BudgetVerdict.GO:
            raise CheckFailed(
                f"{lp.source}: capacity plan is NO-GO (001 §8.2)", hint=f"run `calctl budget {lp.source}`"
            )
        settings: dict[str, SchedulerSettings] = {}
        for alias, cfg in self.configs(lp.package).items():
            model = lp.package.model(alias)
            chip = model.target_chips[0]
            seqs = max_sequences(model, dram, self.budget_policy, package=lp.package, chip=chip)
            tokens = max_kv_tokens(model, dram, self.budget_policy, package=lp.package, chip=chip)
            limit = self.dual_config.model(alias).context_limit if self.dual_config else None
            settings[alias] = scheduler_settings(
                cfg, model, max_sequences=seqs, max_kv_tokens=tokens, context_limit=limit
            )
        return settings

    def configs(self, pkg: Package) -> dict[str, SchedulerConfig]:
        out = {}
        for m in pkg.models:
            if m.alias in self.scheduler_configs:
                out[m.alias] = self.scheduler_configs[m.alias]
            elif self.dual_config is not None:
                out[m.alias] = self.dual_config.model(m.alias).effective_scheduler()
            else:
                out[m.alias] = default_scheduler_config(m.alias)
        return out


__all__ = ["LoadCheck"]
