"""The load generator: a library that offers traffic to an OpenAI-compatible server and measures it.

Like vLLM's ``benchmarks`` package beside its engine, it knows nothing of calctl's runs, devices or verdicts:

* :mod:`~calctl.loadgen.client` – one request as a client saw it (:class:`~calctl.loadgen.client.RequestRecord`)
  and its outcome classes, shared with the in-process clients of :mod:`calctl.runners.traffic`;
* :mod:`~calctl.loadgen.workload` – open-loop arrivals (gamma) and length distributions, seeded;
* :mod:`~calctl.loadgen.dataset` – prompts from local ShareGPT / JSONL files (bounded reads);
* :mod:`~calctl.loadgen.http` – streaming ``/v1/completions`` and ``/v1/chat/completions`` phases over httpx;
* :mod:`~calctl.loadgen.metrics` – TTFT/TPOT/ITL/E2E, throughput, goodput, windowed comparisons.

``calctl bench`` (:mod:`calctl.runners.bench`) builds its scenarios, gates and reports on it. Nothing here
prints, judges a gate or opens a device (docs/bench.md).
"""
