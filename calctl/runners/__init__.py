"""Device runners: golden, warm-up, the combined-calbin PoC, bring-up (docs/runners.md).

Each runner takes a package, a trust policy and a device spec, goes through
:class:`calctl.runners.context.RunContext` (validate before configure, record
the programs configured per chip, tear down on every path) and returns a
report that names the device, runtime version, package digest and signer and
never claims more than it measured (docs/runtime.md §5):

* ``steps``   – one model's prefill + greedy decode on a device (shared);
* ``golden``  – :func:`run_golden_model` (also used by the serving engine) and ``run-golden``;
* ``warmup``  – :func:`run_warmup_model` (also used by the serving engine) and ``warmup``;
* ``poc``     – ``poc combined``: the fixed 001 §6.4 flow and the S1/S2 verdict;
* ``bringup`` – the bench pipeline, an explicit tuple of steps (its last step is a short soak);
* ``soak``    – ``calctl soak``: load/unload cycles under mixed traffic, checked every cycle (docs/soak.md);
* ``bench``   – ``calctl bench``: open-loop load, A/B gates, interference, fault isolation (docs/bench.md);
* ``traffic`` – one request as a client saw it, in-process or over HTTP (shared by soak and bench);
* ``stats``, ``overlap``, ``trace`` – percentiles and bootstrap CIs, the S1/S2 judgement, trace files.

Nothing here prints; the CLI (``calctl.cli.runner_cmds``) renders.
"""
