"""The acceptance report of ``calctl accept``: gates G0–G5 (001 §17) and milestones M0–M4 (000 §19) from evidence.

* :mod:`~calctl.runners.acceptance.rows` – the rows, their conditions and actions, what the judges share (pure);
* :mod:`~calctl.runners.acceptance.gates`, :mod:`~calctl.runners.acceptance.milestones` – the judges of
  G0–G5 and of M0–M4; :mod:`~calctl.runners.acceptance.judges` – the table of them, the evidence-file rule;
* :mod:`~calctl.runners.acceptance.plan` – the levels and the configuration of a run;
* :mod:`~calctl.runners.acceptance.evidence` – the evidence steps (each calls a runner calctl has);
* :mod:`~calctl.runners.acceptance.run` – the run: the steps in order, checkpoints, the verdict;
* :mod:`~calctl.runners.acceptance.rollback` – the rollback step's serving run;
* :mod:`~calctl.runners.acceptance.plot` – the gates at a glance (PNG).

Nothing here prints; ``calctl.cli.accept_cmds`` renders (docs/accept.md).
"""
