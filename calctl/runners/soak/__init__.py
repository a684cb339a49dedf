"""``calctl soak``: load/unload cycles under mixed traffic, with per-cycle checks and evidence that survives a kill.

* :mod:`~calctl.runners.soak.plan` – :class:`SoakConfig` (checked on construction) and :class:`SoakProgress`;
* :mod:`~calctl.runners.soak.run` – :func:`run_soak`, the device and the cycle loop (docs/soak.md);
* :mod:`~calctl.runners.soak.clients` – the traffic's clients and the request/submit accounting;
* :mod:`~calctl.runners.soak.mix` – the mixed traffic, one table of request kinds;
* :mod:`~calctl.runners.soak.state` – what a soak has seen so far;
* :mod:`~calctl.runners.soak.checks` – the invariants (memory drift, counters, generations, requests);
* :mod:`~calctl.runners.soak.judge` – when each invariant is checked, and the verdict;
* :mod:`~calctl.runners.soak.render` – the report (``soak-report.json``) and the picture;
* :mod:`~calctl.runners.soak.evidence` – event log, atomic checkpoints, the figure.

Nothing here prints; ``calctl.cli.soak_cmds`` renders.
"""

from calctl.runners.soak.plan import Injection, SoakConfig, SoakProgress, Traffic, default_report_dir
from calctl.runners.soak.run import run_soak

__all__ = ["Injection", "SoakConfig", "SoakProgress", "Traffic", "default_report_dir", "run_soak"]
