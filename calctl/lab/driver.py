"""The labgrid ``CalctlDriver``: run a calctl command for the board a target has (docs/lab.md).

Bound to one :class:`~calctl.lab.resource.CalculetBoard`. :meth:`CalctlDriver.run` runs the command on the
board's host (here, or over labgrid's SSH connection), streams each progress line to the driver's logger (and
a callback), and leaves the command's report directory, its JUnit and its log in a local directory.

A labgrid environment (``--lg-env``) loads it with ``imports: [calctl.lab.driver]``; ``calctl lab run`` and the
pytest fixture of :mod:`calctl.lab.pytest_plugin` use it too. It imports labgrid (the ``lab`` extra).
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attr
from labgrid.driver.common import Driver
from labgrid.factory import target_factory

from calctl.lab.board import BoardRun, LabBoard, LabCommand, Stopper, run_on_board, unreachable
from calctl.lab.resource import CalculetBoard, command_prefix

_counter = itertools.count(1)


@target_factory.reg_driver
@attr.s(eq=False)
class CalctlDriver(Driver):
    """Runs calctl commands for the target's Calculet board.

    Args:
        out_dir: the local directory under which each run gets ``<board_id>-<n>/`` (default: a new temporary
            directory)
    """

    bindings: ClassVar[dict[str, Any]] = {"board": CalculetBoard}
    out_dir = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._base: Path | None = Path(self.out_dir) if self.out_dir else None

    @property
    def lab_board(self) -> LabBoard:
        return self.board.lab_board()

    @Driver.check_active
    def run(
        self,
        *args: str,
        out_dir: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        stopper: Stopper | None = None,
    ) -> BoardRun:
        """Run ``calctl ARGS...`` (e.g. ``"bringup", "--level", "quick"``) for the board; the lab sets
        ``--report``, ``--format``, ``--device`` and ``--fault-plan``. Returns the :class:`BoardRun` (its
        ``verdict``, or its ``infra_error`` when the host or the command's start failed)."""
        board = self.lab_board
        command = LabCommand.parse(args)
        if out_dir is None:
            if self._base is None:
                self._base = Path(tempfile.mkdtemp(prefix="calctl-lab-"))
            out_dir = self._base / f"{board.board_id.replace('/', '_')}-{next(_counter)}"
        try:
            prefix = command_prefix(board, getattr(self.board, "extra", None))
        except Exception as e:  # labgrid's ExecutionError: the SSH master connection failed
            return unreachable(board, command, out_dir, f"cannot reach the host over SSH: {e}")

        def line(text: str) -> None:
            self.logger.info("%s: %s", board.board_id, text)
            if on_line is not None:
                on_line(text)

        return run_on_board(board, command, out_dir, prefix=prefix, on_line=line, stopper=stopper)


__all__ = ["CalctlDriver"]
