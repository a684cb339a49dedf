"""The calctl serving stack (000 §2–§16, 001 §9–§11).

``core/`` holds the pure scheduling logic: request state machine, admission,
fairness, prefill/decode scheduling and KV lane bookkeeping, with time passed
in as an argument. ``config.py`` loads and cross-checks the scheduler and
dual-model YAML files.

This package does not (yet) contain the engine loop, the HTTP API or the model
manager; those import ``core`` and drive it, never the other way round.
"""
