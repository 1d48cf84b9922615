"""Per-tenant rate limits within a channel (``TENANT_RATE_LIMITS``): how many of each tenant's rows a
claim may take, and when each claimed record may start.

A tenant's limit is enforced in two places, each cheap:

- the claim takes at most what the tenant may start within the rate horizon (:meth:`TenantLimits.caps`,
  passed to the claim as :class:`~notifications_retry.delivery.TenantCaps`): a tenant at its limit is not
  claimed at all, so its backlog stays due in the table, untouched, while other tenants' rows are taken;
- a claimed record of a limited tenant starts only when the tenant's limiter has a slot
  (:meth:`TenantLimits.pop`), taken as it starts, like the channel's own; it waits in its channel's queue
  meanwhile, without holding up other tenants' records behind it.

The limiter is the channel's own kind (engine.flow_control.RateLimiter, a bucket of one): starts are
evenly spaced, so no 1-second window holds more than ``ceil(rate)`` starts of a tenant on a channel.
The limit is a total over the workers that share the channel: each uses its lane's part and its
partitions' share of it, as it does with the channel's own limits. State lives with its channel
(engine.channels), changed where the channel's is; a tenant whose bucket is full again and has nothing
queued is forgotten, so memory follows the tenants sending right now.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from collections.abc import Iterable, Mapping

from notifications_retry.delivery import ClaimedRecord, TenantCaps
from notifications_retry.engine.flow_control import RateLimiter

Tenant = uuid.UUID | None
#: The cap of a tenant named with no limit (None) beside a default that limits the others.
NO_CAP = 2**31 - 1


class TenantLimits:
    """One channel's per-tenant limiters (``default``: the limit of every tenant not in ``named``)."""

    def __init__(self, default: float | None, named: Mapping[uuid.UUID, float | None]) -> None:
        self.default, self.named = default, dict(named)
        #: This worker's part of every limit: its lane's part times its partitions' share.
        self.part = 1.0
        #: Tenants that started a send lately or have records queued; one whose next slot has come and
        #: has nothing queued is dropped (a fresh limiter is alike).
        self.limiters: dict[Tenant, RateLimiter] = {}
        #: Claimed records of each limited tenant not started yet: they will take its next slots.
        self.queued: dict[Tenant, int] = {}

    def rate(self, tenant: Tenant) -> float | None:
        """The tenant's sends a second on this channel, this worker's part of it (None: no limit)."""
        limit = self.named.get(tenant, self.default) if tenant is not None else self.default
        return limit * self.part if limit is not None else None

    def set_part(self, part: float) -> None:
        """Use ``part`` (0 to 1) of each tenant's limit; a start already booked keeps its time."""
        self.part = part
        for tenant, limiter in self.limiters.items():
            limiter.set_rate(self.rate(tenant))

    def caps(self, now: float, horizon: float) -> TenantCaps:
        """At most how many rows of each tenant a claim at ``now`` may take: what it may start within
        ``horizon`` seconds (a claim takes rows for the near future, like the channel's own limiter),
        less its records already queued."""
        self._forget(now)
        caps = {
            tenant: max(0, limiter.available_within(now, horizon) - self.queued.get(tenant, 0))
            for tenant, limiter in self.limiters.items()
        }
        for tenant in self.named.keys() - caps.keys():
            rate = self.rate(tenant)
            caps[tenant] = _fresh_cap(rate, horizon) if rate is not None else NO_CAP
        default = _fresh_cap(self.default * self.part, horizon) if self.default is not None else None
        return TenantCaps(default=default, caps=caps)

    def admit(self, record: ClaimedRecord) -> None:
        """A claimed record joins its channel's queue: it will take one of its tenant's slots."""
        tenant = record.tenant_id
        if self.rate(tenant) is not None:
            self._limiter(tenant)
            self.queued[tenant] = self.queued.get(tenant, 0) + 1

    def start(self, record: ClaimedRecord, now: float) -> bool:
        """Whether the record may start now; if so, its tenant's slot is spent (call once per start)."""
        limiter = self.limiters.get(record.tenant_id)
        if limiter is None:
            rate = self.rate(record.tenant_id)
            if rate is None:
                return True
            limiter = self._limiter(record.tenant_id)
        if not limiter.ready(now):
            return False
        limiter.take(now)
        return True

    def pop(self, queue: deque[ClaimedRecord], now: float) -> ClaimedRecord | None:
        """The first queued record that may start now, taken out of ``queue`` with its tenant's slot
        spent (None: every queued record's tenant waits); other tenants' records pass one that waits."""
        if not self.queued:
            return queue.popleft()
        for index, record in enumerate(queue):
            if self.start(record, now):
                del queue[index]
                self._unqueue(record)
                return record
        return None

    def wait_time(self, queue: Iterable[ClaimedRecord], now: float) -> float:
        """Seconds until a queued record's tenant may start again (0.0: one may start now, or none waits)."""
        waits = [
            limiter.wait_time(now) if (limiter := self.limiters.get(record.tenant_id)) is not None else 0.0
            for record in queue
        ]
        return min(waits) if waits else 0.0

    def limiting(self, caps: TenantCaps, tenants: Iterable[Tenant]) -> list[Tenant]:
        """The tenants that may have left due rows behind a claim under ``caps`` that returned rows of
        ``tenants``: those it held (cap 0) and those that reached their cap."""
        counts: dict[Tenant, int] = {}
        for tenant in tenants:
            counts[tenant] = counts.get(tenant, 0) + 1
        held = [tenant for tenant, cap in caps.caps.items() if cap == 0]
        reached = [
            tenant
            for tenant, count in counts.items()
            if (cap := caps.caps.get(tenant, caps.default)) is not None and 0 < cap <= count < NO_CAP
        ]
        return held + reached

    def room_in(self, tenants: Iterable[Tenant], now: float, horizon: float) -> float:
        """Seconds until one of ``tenants`` may be claimed again: its next slot past those of its queued
        records comes within the horizon."""
        waits = [
            limiter.next_at + self.queued.get(tenant, 0) * limiter.interval - horizon - now
            for tenant in tenants
            if (limiter := self.limiters.get(tenant)) is not None
        ]
        return max(0.0, min(waits)) if waits else 0.0

    def forget(self, records: Iterable[ClaimedRecord]) -> None:
        """Records taken off the queue unsent (given back, or the tick's queue cleared)."""
        for record in records:
            self._unqueue(record)

    def _limiter(self, tenant: Tenant) -> RateLimiter:
        limiter = self.limiters.get(tenant)
        if limiter is None:
            limiter = self.limiters[tenant] = RateLimiter(self.rate(tenant))
        return limiter

    def _unqueue(self, record: ClaimedRecord) -> None:
        count = self.queued.get(record.tenant_id, 0)
        if count > 1:
            self.queued[record.tenant_id] = count - 1
        elif count:
            del self.queued[record.tenant_id]

    def _forget(self, now: float) -> None:
        # A limiter whose next slot has come, with nothing queued, counts like a new one: dropping it
        # bounds memory by the tenants sending right now.
        done = [t for t, limiter in self.limiters.items() if limiter.next_at <= now and t not in self.queued]
        for tenant in done:
            del self.limiters[tenant]


def _fresh_cap(rate: float, horizon: float) -> int:
    """What a tenant that has not sent lately may start within ``horizon`` (RateLimiter.available_within)."""
    return math.floor(horizon * rate) + 1


__all__ = ["TenantLimits"]
