"""``calctl bench``: load generation and A/B serving verdicts (001 §9.4, §12 Phases 3–4, §13.2, §13.4).

* :mod:`~calctl.runners.bench.workload` – open-loop arrivals (gamma) and length distributions;
* :mod:`~calctl.runners.bench.http` – streaming ``/v1/completions`` phases over httpx;
* :mod:`~calctl.runners.bench.metrics` – TTFT/TPOT/ITL/E2E, throughput, goodput, windowed comparisons;
* :mod:`~calctl.runners.bench.gates` – the 001 §13.2 gates;
* :mod:`~calctl.runners.bench.base` – what a scenario receives and returns;
* :mod:`~calctl.runners.bench.scenarios` – the registry (``ab``, ``interference``, ``fault-isolation``);
* :mod:`~calctl.runners.bench.plot` – the pictures.

Nothing here prints; ``calctl.cli.bench_cmds`` renders (docs/bench.md).
"""
