"""``calctl soak``: load/unload cycles under mixed traffic, with per-cycle checks and evidence that survives a kill.

* :mod:`~calctl.runners.soak.run` – :func:`run_soak`, the cycle loop (docs/soak.md);
* :mod:`~calctl.runners.soak.mix` – the mixed traffic, one table of request kinds;
* :mod:`~calctl.runners.soak.checks` – the invariants (memory drift, counters, generations, requests);
* :mod:`~calctl.runners.soak.evidence` – event log, atomic checkpoints, the picture.

Nothing here prints; ``calctl.cli.soak_cmds`` renders.
"""

from calctl.runners.soak.run import (
    Injection,
    SoakConfig,
    SoakProgress,
    Traffic,
    default_report_dir,
    run_soak,
)

__all__ = ["Injection", "SoakConfig", "SoakProgress", "Traffic", "default_report_dir", "run_soak"]
