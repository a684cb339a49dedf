"""The CLI surface as data: every top-level command, the module that registers it, and its one-line help.

Pure data, importable in a millisecond: ``calctl --help`` is rendered from it
without importing Typer or any command module (``calctl.cli.main``), and the
Typer application (``calctl.cli.app``) imports a command's module only when that
command runs. A unit test keeps each line equal to the command's own docstring.
"""

from __future__ import annotations

ROOT_HELP = (
    "Validate, seal and budget calbin packages; run bring-up checks and serve models on a Calculet board "
    "(mock device by default)."
)

#: Options of the root command: (flag, help).
ROOT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--debug", "Show tracebacks for errors. [env var: CALCTL_DEBUG]"),
    ("--version", "Print the version."),
    ("--help", "Show this message and exit."),
)

# Explicit registry, in --help order: command -> (module with register(app), the line --help lists).
COMMANDS: dict[str, tuple[str, str]] = {
    "keygen": ("calctl.cli.package_cmds", "Create an Ed25519 signing key pair for packages."),
    "sample-package": (
        "calctl.cli.package_cmds",
        "Write a complete, valid, signed sample package for the mock device (the reference mock compiler).",
    ),
    "pack": ("calctl.cli.package_cmds", "Seal a package: checksums.sha256 for every file, signed, optionally tarred."),
    "sign": ("calctl.cli.package_cmds", "(Re-)sign an already packed package's checksums.sha256."),
    "verify": ("calctl.cli.package_cmds", "Check every hash and the signature (fast; no other validation)."),
    "inspect": ("calctl.cli.package_cmds", "Show what a package contains: models, graphs, chips, memory plan, signer."),
    "import": (
        "calctl.cli.import_cmds",
        "Import a real checkpoint (Hugging Face or GGUF) as a sealed package the mock can run.",
    ),
    "combine": (
        "calctl.cli.import_cmds",
        "Make a combined (two models, one per chip) or replica (one model on both chips) package.",
    ),
    "validate": ("calctl.cli.validate_cmds", "Statically validate a package before it touches a board."),
    "rules": ("calctl.cli.validate_cmds", "List every validation rule: ID, group, severity, summary."),
    "explain": ("calctl.cli.validate_cmds", "Explain one validation rule: what it checks, why, and where from."),
    "budget": ("calctl.cli.budget_cmds", "Per-chip capacity plan and GO/NO-GO (001 §8, gate G0)."),
    "device": ("calctl.cli.device_cmds", "Look at the board (mock by default, or CalRT)."),
    "run-golden": ("calctl.cli.runner_cmds", "Golden correctness of every model on a device."),
    "warmup": ("calctl.cli.runner_cmds", "Warm-up latency percentiles and stability per graph on a device."),
    "poc": ("calctl.cli.runner_cmds", "Proof-of-concept flows on a device (001 §6.4)."),
    "bringup": (
        "calctl.cli.runner_cmds",
        "The bench pipeline in one command: device check, ABI conformance, self-test, burn-in, validate, budget, "
        "golden, warm-up, PoC, soak.",
    ),
    "accept": (
        "calctl.cli.accept_cmds",
        "Acceptance report: gates G0–G5 and milestones M0–M4, each GO, NO-GO or NOT MEASURED from evidence.",
    ),
    "serve": (
        "calctl.cli.serve_cmds",
        "Serve the package's models over an OpenAI-compatible HTTP API (one model per chip).",
    ),
    "soak": ("calctl.cli.soak_cmds", "Load/unload soak under mixed traffic, with evidence on disk."),
    "burn-in": (
        "calctl.cli.burnin_cmds",
        "Run both chips at sustained maximum load and grade their telemetry against limits.",
    ),
    "bench": (
        "calctl.cli.bench_cmds",
        "Load generator and verdicts: A/B, interference, fault-isolation, executor-modes.",
    ),
    "report": (
        "calctl.cli.fleet_cmds",
        "Merge several boards' report directories into a fleet report, or compare two reports figure by figure.",
    ),
    "lab": ("calctl.cli.lab_cmds", "Boards in a labgrid lab: run a calctl command over tagged places."),
}
