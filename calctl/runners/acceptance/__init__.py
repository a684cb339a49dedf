"""The acceptance report of ``calctl accept``: gates G0–G5 (001 §17) and milestones M0–M4 (000 §19) from evidence.

* :mod:`~calctl.runners.acceptance.rows` – the rows, their conditions and actions, and the judges (pure);
* :mod:`~calctl.runners.acceptance.run` – the evidence steps, levels and checkpoints;
* :mod:`~calctl.runners.acceptance.plot` – the gates at a glance (PNG).

Nothing here prints; ``calctl.cli.accept_cmds`` renders (docs/accept.md).
"""
