"""Typed identifiers of the serving core (000 §2, §9.1, §10).

``NewType`` wrappers so a request id cannot be passed where a KV lane is
expected. They cost nothing at run time. This module defines no behaviour.
"""

from __future__ import annotations

from typing import NewType

RequestId = NewType("RequestId", str)
"""Server-assigned request id (000 §2 ``RequestId``); never used as a metric label (000 §16)."""

JobId = NewType("JobId", int)
"""One device job (prefill or decode batch); every completion callback carries it (000 §4)."""

ModelGenerationId = NewType("ModelGenerationId", int)
"""An immutable ModelGeneration (000 §10); a request is pinned to one."""

LaneId = NewType("LaneId", int)
"""A hardware KV lane / runtime KV sequence slot (000 §9.1 ``hardware_lane``)."""

TenantId = NewType("TenantId", str)
"""A tenant as named in configuration; weights and quotas hang off it (000 §5.3)."""
