"""The labgrid ``CalculetBoard`` resource: a Calculet board as an exporter publishes it (docs/lab.md).

An exporter needs no calctl code: labgrid 26 publishes a resource class it does not know as it is (its
fields become the resource's parameters), so an exporter config names ``CalculetBoard`` and its fields. The
client side (``calctl lab run``, the :class:`~calctl.lab.driver.CalctlDriver`, a labgrid environment with
``imports: [calctl.lab.driver]``) turns those parameters back into this class. ``host`` says where the board
is: unset (or this machine's own name), the command runs here; else through labgrid's SSH connection manager
(one control-master connection per host, keys and ports from the client's ``~/.ssh/config``).

This module imports labgrid (the ``lab`` extra). It runs nothing itself: :mod:`calctl.lab.board` does.
"""

from __future__ import annotations

import socket
from typing import Any

import attr
from labgrid.factory import target_factory
from labgrid.resource.common import Resource

from calctl.lab.board import LabBoard, board_from_params

_opt_str = attr.validators.optional(attr.validators.instance_of(str))


@target_factory.reg_resource
@attr.s(eq=False)
class CalculetBoard(Resource):
    """A Calculet board: its label, device kind, what selects it, and the host it is on.

    Args:
        board_id: the board's label (``CALCTL_BOARD_ID``: letters, digits, ``. _ : / -``, at most 64)
        device: ``mock`` or ``calrt``
        calrt_device: handed to the shim as ``CALRT_DEVICE`` (e.g. a PCI address)
        mock_seed: the mock board's fault-injection seed (``CALCTL_MOCK_SEED``)
        fault_plan: a mock fault plan's path on the board's host (``--fault-plan``)
        calrt_library: the shim library's path on the board's host (``CALRT_LIBRARY``)
        host: the host to reach over SSH; unset: the machine that runs the client
        calctl: the command that starts calctl on that host (default ``calctl``)
        workdir: where a run writes on that host before its report comes back (default ``$TMPDIR``)
    """

    board_id = attr.ib(validator=attr.validators.instance_of(str))
    device = attr.ib(default="mock", validator=attr.validators.instance_of(str))
    calrt_device = attr.ib(default=None, validator=_opt_str)
    mock_seed = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(int)))
    fault_plan = attr.ib(default=None, validator=_opt_str)
    calrt_library = attr.ib(default=None, validator=_opt_str)
    host = attr.ib(default=None, validator=_opt_str)
    calctl = attr.ib(default="calctl", validator=attr.validators.instance_of(str))
    workdir = attr.ib(default=None, validator=_opt_str)

    def lab_board(self) -> LabBoard:
        """The board as calctl's lab code takes it (bad fields: a UsageError naming them)."""
        names = [f.name for f in attr.fields(type(self)) if f.name in LabBoard.__dataclass_fields__]
        return board_from_params({n: getattr(self, n) for n in names})


def is_local(host: str | None) -> bool:
    """Whether ``host`` is this machine by name (then a command runs here, without SSH)."""
    return not host or host in {socket.gethostname(), socket.getfqdn()}


def command_prefix(board: LabBoard, extra: dict[str, Any] | None = None) -> list[str]:
    """The prefix that runs a command on ``board``'s host: empty here, else labgrid's SSH connection's (opened
    now; an unreachable host raises labgrid's ``ExecutionError``). An isolated exporter (``proxy_required``)
    is reached through its proxy."""
    from labgrid.util.ssh import sshmanager

    host = board.host
    if extra and extra.get("proxy_required") and extra.get("proxy"):
        host = str(extra["proxy"])
    if is_local(host):
        return []
    assert host is not None
    return [*sshmanager.get(host).get_prefix(), "--"]


__all__ = ["CalculetBoard", "command_prefix", "is_local"]
