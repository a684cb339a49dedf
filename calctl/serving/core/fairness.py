"""Weighted fair queuing tags across tenants (000 §5.3).

Each request is stamped at admission time with::

    cost           = prompt_tokens + decode_weight * requested_output_tokens
    virtual_start  = max(tenant_virtual_time, global_virtual_time)
    virtual_finish = virtual_start + cost / weight          # 000 §5.3

and queues order by ``virtual_finish``. Two rules go beyond the formula:

* **charge what was served** -- when a request ends early (EOS, cancel, expiry,
  rejection after stamping) the unused part of its cost is credited back to
  the tenant's virtual time, never below the global virtual time;
* **no banking of idle time** -- a tenant with nothing outstanding has its
  virtual time lifted to the global virtual time when it returns, so a tenant
  that was quiet for an hour cannot then monopolise the device.

``global_virtual_time`` advances to the start tag of each request dispatched
(start-time fair queuing), so it tracks the service actually given.

Weights come from configuration only (a request can never name its weight).
This module only computes tags; it does not hold queues or decide admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from calctl.serving.core.ids import TenantId


@dataclass(frozen=True, slots=True)
class FairTag:
    """The WFQ tags of one request."""

    tenant: TenantId
    start: float
    finish: float
    cost: float


class _Tenant:
    __slots__ = ("outstanding", "served_cost", "vt", "weight")

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.vt = 0.0
        self.outstanding = 0
        self.served_cost = 0.0


class WeightedFairness:
    """Virtual-time bookkeeping for weighted fair queuing over tenants (000 §5.3)."""

    def __init__(
        self,
        weights: Mapping[TenantId, float] | None = None,
        *,
        default_weight: float = 1.0,
        decode_weight: float = 1.0,
    ) -> None:
        for tenant, w in (weights or {}).items():
            if not w > 0:
                raise ValueError(f"tenant {tenant!r}: weight must be > 0, got {w!r}")
        if not default_weight > 0 or not decode_weight >= 0:
            raise ValueError("default_weight must be > 0 and decode_weight >= 0")
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self.decode_weight = decode_weight
        self._tenants: dict[TenantId, _Tenant] = {}
        self.global_virtual_time = 0.0

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """000 §5.3 cost of a request."""
        return prompt_tokens + self.decode_weight * output_tokens

    def weight(self, tenant: TenantId) -> float:
        return self._weights.get(tenant, self._default_weight)

    def tenant_virtual_time(self, tenant: TenantId) -> float:
        t = self._tenants.get(tenant)
        return t.vt if t is not None else self.global_virtual_time

    def served_cost(self, tenant: TenantId) -> float:
        """Cost actually charged to ``tenant`` so far (000 §16 "per-tenant service tokens")."""
        t = self._tenants.get(tenant)
        return t.served_cost if t is not None else 0.0

    def virtual_lag(self, tenant: TenantId) -> float:
        """How far the tenant's virtual time is ahead of the system's (000 §16 "virtual lag")."""
        return self.tenant_virtual_time(tenant) - self.global_virtual_time

    def stamp(self, tenant: TenantId, prompt_tokens: int, output_tokens: int) -> FairTag:
        """Stamp a new request and advance the tenant's virtual time by its full cost."""
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(self.weight(tenant))
            t.vt = self.global_virtual_time
        if t.outstanding == 0 and t.vt < self.global_virtual_time:
            t.vt = self.global_virtual_time  # returning from idle: idle time is not banked
        cost = self.cost(prompt_tokens, output_tokens)
        start = t.vt if t.vt > self.global_virtual_time else self.global_virtual_time  # 000 §5.3 max(...)
        finish = start + cost / t.weight
        t.vt = finish
        t.outstanding += 1
        return FairTag(tenant, start, finish, cost)

    def dispatched(self, tag: FairTag) -> None:
        """The request entered service: the global virtual time follows its start tag."""
        if tag.start > self.global_virtual_time:
            self.global_virtual_time = tag.start

    def settle(self, tag: FairTag, served_prompt_tokens: int, served_output_tokens: int) -> float:
        """The request ended: charge what was served, credit the rest back. Returns the credited cost."""
        t = self._tenants[tag.tenant]
        served = min(tag.cost, self.cost(served_prompt_tokens, served_output_tokens))
        unused = tag.cost - served
        t.outstanding -= 1
        t.served_cost += served
        if unused > 0:
            t.vt -= unused / t.weight
            if t.vt < self.global_virtual_time:
                t.vt = self.global_virtual_time  # a credit never moves a tenant behind the system
        return unused
