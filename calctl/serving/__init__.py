"""The calctl serving stack (000 §2–§16, 001 §4, §9–§14).

* ``core/``: the pure scheduling logic (request state machine, admission,
  fairness, prefill/decode scheduling, KV lane bookkeeping), with time passed in
  as an argument; it imports nothing from ``engine``, ``api`` or the runtime.
* ``engine/``: the engine loop (one :class:`~calctl.serving.engine.loop.EngineCore`
  per alias, the only caller of its scheduler), the device executor, the output
  processor and the :class:`~calctl.serving.engine.supervisor.DeviceSupervisor`
  that owns the board and the model lifecycle.
* ``api/``: the OpenAI-compatible HTTP layer, which knows the engine only as
  :class:`~calctl.serving.protocol.EngineClient`.
* ``config.py`` loads and cross-checks the scheduler and dual-model YAML files;
  ``outcomes.py`` is the one table from a request's end to HTTP and metrics;
  ``record_sink.py`` writes the 001 §14 NDJSON records; ``launch.py`` wires
  ``calctl serve`` together (socket, board, supervisor, app).
"""
