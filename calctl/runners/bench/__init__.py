"""``calctl bench``: load generation and A/B serving verdicts (001 §9.4, §12 Phases 3–4, §13.2, §13.4).

* :mod:`calctl.loadgen` – the load generator it drives a server with: arrivals, datasets, the HTTP client and
  the latency statistics (a library of its own);
* :mod:`~calctl.runners.bench.gates` – the 001 §13.2 gates;
* :mod:`~calctl.runners.bench.base` – what a scenario receives and returns;
* :mod:`~calctl.runners.bench.scenarios` – the registry of scenarios and the option rules (docs/bench.md §7);
* :mod:`~calctl.runners.bench.plot` – the pictures.

Nothing here prints; ``calctl.cli.bench_cmds`` renders (docs/bench.md).
"""
