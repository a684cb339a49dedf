"""Per-model checks on a configured device: golden correctness and warm-up (001 §11.1, §12 Phase 1).

Both the serving engine (golden + warm-up before Ready) and the runners (``calctl run-golden``,
``calctl warmup``, the PoC, soak, bringup) call these, so they sit below both: they take a runtime
and a package, do no configuring, printing or file writing, and import nothing above ``runtime``.
"""
