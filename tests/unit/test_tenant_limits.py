"""Per-tenant rate limits (``TENANT_RATE_LIMITS``): the setting's checks, the limiter's caps and slots,
and a tick on a fake clock and a fake database port that honours the caps as the claim does."""

from __future__ import annotations

import dataclasses
import itertools
import math
import uuid
from collections import deque
from typing import Any

import pytest
from prometheus_client import REGISTRY

from notifications_retry.conf import RetrySettings, settings_problems, tenant_rate_limits
from notifications_retry.delivery import ClaimBatch, ClaimRequest, TenantCaps
from notifications_retry.engine.tenant_limits import NO_CAP, TenantLimits
from tests.support.fake_tick import (
    CONF,
    FakeDatabase,
    FakeTime,
    channel,
    max_in_window,
    provider,
    run_tick,
)
from tests.support.records import claimed_record

A, B, C = uuid.UUID(int=0xA), uuid.UUID(int=0xB), uuid.UUID(int=0xC)
HORIZON = 0.25


# -- the setting ------------------------------------------------------------------------------------


def problems(limits: Any) -> list[str]:
    return settings_problems(dataclasses.replace(RetrySettings(), TENANT_RATE_LIMITS=limits))


def test_the_setting_reads_a_default_and_named_tenants_none_meaning_no_limit():
    conf = dataclasses.replace(
        RetrySettings(), TENANT_RATE_LIMITS={"*": 5, str(A): 50.5, str(B).upper(): None}
    )
    assert problems(conf.TENANT_RATE_LIMITS) == []
    assert tenant_rate_limits(conf) == (5.0, {A: 50.5, B: None})
    assert tenant_rate_limits(RetrySettings()) == (None, {})


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ([("*", 5)], "must map tenant ids"),
        ({"acme": 5}, "'acme', which is neither a tenant id"),
        ({"*": 0}, "TENANT_RATE_LIMITS['*'] must be sends a second above 0"),
        ({"*": None}, "TENANT_RATE_LIMITS['*'] must be sends a second"),
        ({str(A): -1}, "must be sends a second above 0"),
        ({str(A): float("nan")}, "must be sends a second above 0"),
        ({str(A): float("inf")}, "at most 1e+06"),
        ({str(A): True}, "must be sends a second"),
        ({str(A): "10"}, "must be sends a second"),
        ({str(A): 1, str(A).upper(): 2}, f"names tenant {A} twice"),
    ],
)
def test_a_wrong_limit_is_described(limits: Any, fragment: str):
    assert any(fragment in p for p in problems(limits)), problems(limits)


# -- caps and slots ---------------------------------------------------------------------------------


def test_a_tenant_not_seen_lately_may_take_what_it_can_start_within_the_horizon():
    limits = TenantLimits(10.0, {A: 100.0, B: None})
    caps = limits.caps(0.0, HORIZON)
    assert caps.default == math.floor(HORIZON * 10) + 1 == 3
    assert caps.caps == {A: 26, B: NO_CAP}  # named tenants' own; a tenant with None is not capped


def started(limits: TenantLimits, tenant: uuid.UUID | None, at: float) -> bool:
    return limits.start(claimed_record(tenant_id=tenant), at)


def test_starts_are_spaced_by_the_rate_and_queued_records_count_against_a_claim():
    limits = TenantLimits(10.0, {})
    assert started(limits, A, 0.0) and not started(limits, A, 0.05) and started(limits, A, 0.1)
    # Its next slot is 0.2 s: within 0.1 + 0.25 it may start 2 more (0.2, 0.3).
    assert limits.caps(0.1, HORIZON).caps[A] == 2
    queued = [claimed_record(tenant_id=A) for _ in range(2)]
    for record in queued:
        limits.admit(record)
    assert limits.caps(0.1, HORIZON).caps[A] == 0  # both slots are spoken for: A is held
    limits.forget(queued[:1])
    assert limits.caps(0.1, HORIZON).caps[A] == 1
    # Another tenant and the null tenant have limiters of their own.
    assert started(limits, B, 0.1) and started(limits, None, 0.1) and not started(limits, None, 0.15)


def test_a_worker_keeps_its_part_of_each_limit():
    limits = TenantLimits(10.0, {A: 40.0})
    limits.set_part(0.25)  # one of four partitions
    assert limits.rate(A) == 10.0 and limits.rate(B) == 2.5 and limits.rate(None) == 2.5
    assert started(limits, B, 0.0) and not started(limits, B, 0.39) and started(limits, B, 0.4)
    assert limits.caps(0.4, HORIZON).default == 1  # floor(0.25 * 2.5) + 1


def test_a_tenant_whose_bucket_is_full_again_and_has_nothing_queued_is_forgotten():
    limits = TenantLimits(10.0, {})
    for tenant in (A, B):
        assert started(limits, tenant, 0.0)
    limits.admit(claimed_record(tenant_id=B))
    assert set(limits.limiters) == {A, B}
    limits.caps(0.1, HORIZON)
    assert set(limits.limiters) == {B}  # A's slot came at 0.1; B still has a record queued


def test_no_limit_spends_nothing():
    limits = TenantLimits(None, {A: 10.0})
    record = claimed_record(tenant_id=B)
    limits.admit(record)
    assert limits.start(record, 5.0) and not limits.limiters and not limits.queued
    assert limits.caps(5.0, HORIZON) == TenantCaps(default=None, caps={A: 3})


def test_a_record_waiting_for_its_tenant_lets_other_tenants_records_start_first():
    limits = TenantLimits(10.0, {})
    first_a, second_a, b = (claimed_record(tenant_id=t) for t in (A, A, B))
    queue = deque([first_a, second_a, b])
    for record in queue:
        limits.admit(record)
    assert limits.pop(queue, 0.0) is first_a
    assert limits.pop(queue, 0.0) is b  # A's second waits for 0.1 s; B's goes ahead of it
    assert limits.pop(queue, 0.0) is None and list(queue) == [second_a]
    assert limits.wait_time(queue, 0.0) == pytest.approx(0.1)
    assert limits.pop(queue, 0.1) is second_a and not limits.queued


def test_a_late_start_does_not_let_the_next_one_start_early():
    # Starts, not claims, take the slots: a record that started late (its channel was busy) pushes
    # the next one back, so no window holds more than the limit whatever the queue did.
    limits = TenantLimits(10.0, {})
    assert started(limits, A, 0.0) and started(limits, A, 0.35)
    assert not started(limits, A, 0.4) and started(limits, A, 0.45)


def test_the_tenants_that_cut_a_claim_short_and_when_they_have_room_again():
    limits = TenantLimits(10.0, {C: None})
    assert started(limits, A, 0.0)
    for _ in range(4):
        limits.admit(claimed_record(tenant_id=A))  # A's next slots: 0.1 to 0.4 s, past the horizon
    caps = limits.caps(0.0, HORIZON)
    assert caps.caps[A] == 0 and caps.caps[C] == NO_CAP
    # B reached the default cap of 3, C has none, the null tenant took 1 of 3.
    returned = [B, B, B, C, C, C, C, None]
    assert sorted(limits.limiting(caps, returned), key=str) == sorted([A, B], key=str)
    assert started(limits, B, 0.0)
    for _ in range(2):
        limits.admit(claimed_record(tenant_id=B))
    # B has room again when the slot after its queued two (0.3 s) is within the horizon: at 0.05 s;
    # A when its sixth (0.5 s) is: at 0.25 s.
    assert limits.room_in([A, B], 0.0, HORIZON) == pytest.approx(0.05)
    assert limits.room_in([A], 0.0, HORIZON) == pytest.approx(0.25)
    assert limits.limiting(TenantCaps(default=3), [B, B, None]) == []


# -- a tick ------------------------------------------------------------------------------------------


class CappedDatabase(FakeDatabase):
    """The fake port, taking rows as the claim does under tenant caps: a tenant's rows up to its cap,
    the other tenants' rows filling the rest (rows in the order they were added)."""

    def __init__(self, time: FakeTime) -> None:
        super().__init__(time)
        self.caps_seen: list[TenantCaps | None] = []

    def add_tenant(self, channel_id: int, tenant: uuid.UUID | None, count: int) -> None:
        for row in self.add(channel_id, count):
            row.tenant_id = tenant

    def claim(self, request: ClaimRequest, **options: Any) -> ClaimBatch:
        capped = []
        for p in request.plan:
            self.caps_seen.append(p.tenant_caps)
            rows = self.due.get(p.channel_id, [])
            caps = p.tenant_caps or TenantCaps()
            taken: dict[uuid.UUID | None, int] = {}
            allowed = []
            for row in rows:
                cap = caps.caps.get(row.tenant_id, caps.default)
                if cap is None or taken.get(row.tenant_id, 0) < cap:
                    taken[row.tenant_id] = taken.get(row.tenant_id, 0) + 1
                    allowed.append(row)
            # The rows the caps let through first, the rest behind them (never taken past the limit
            # while a capped tenant's surplus is ahead: the claim stops at the caps).
            allowed = allowed[: p.limit]
            rows[:] = allowed + [r for r in rows if r not in allowed]
            capped.append(dataclasses.replace(p, limit=len(allowed)))
        return super().claim(dataclasses.replace(request, plan=capped), **options)


def test_a_limited_tenants_sends_start_evenly_spaced_while_an_unlimited_one_drains_at_once():
    time = FakeTime()
    db = CappedDatabase(time)
    rt = channel(time, 1)
    rt.tenants = TenantLimits(None, {A: 10.0})
    db.add_tenant(1, A, 30)
    db.add_tenant(1, B, 30)
    stats = run_tick(time, db, [rt])
    calls = provider(rt).calls
    tenant_of = {o.record.id: o.record.tenant_id for o in db.committed}
    starts_a = [t for t, nid in calls if tenant_of[nid] == A]
    starts_b = [t for t, nid in calls if tenant_of[nid] == B]
    # One tick sends every row: a claim cut short by A's limit does not end it.
    assert stats.sent == 60 and not db.due[1] and not db.leased
    assert min(b - a for a, b in itertools.pairwise(starts_a)) >= 0.1 - 1e-9
    assert max_in_window(starts_a) <= 10
    assert starts_a[-1] == pytest.approx(2.9, abs=0.15)  # 30 sends at 10 a second, none lost time
    assert max(starts_b) < 0.5  # B never waits behind A's slots
    # Every claim asked for at most what A could start within the horizon.
    assert all(c is None or c.caps.get(A, 0) <= 3 for c in db.caps_seen)


def test_a_held_tenant_does_not_make_the_tick_claim_in_a_loop():
    time = FakeTime()
    db = CappedDatabase(time)
    rt = channel(time, 1)
    rt.tenants = TenantLimits(2.0, {})
    db.add_tenant(1, A, 6)
    stats = run_tick(time, db, [rt])
    assert stats.sent == 6
    # The claim after a cut-short one waits for the tenant's room, at most the horizon (other
    # tenants' rows may fall due meanwhile): about one a horizon, not a claim in a loop.
    assert len(db.claims) <= time.t / HORIZON + 6
    # The gauge says how many tenants the last claim held at their limit.
    assert any(0 in caps.caps.values() for caps in db.caps_seen if caps is not None)
    last = db.caps_seen[-1]
    assert last is not None
    held = REGISTRY.get_sample_value("notifications_retry_tenants_held", {"channel": rt.key})
    assert held == sum(1 for cap in last.caps.values() if cap == 0)
    assert time.t == pytest.approx(2.5, abs=0.3)


def test_without_tenant_limits_the_plan_carries_no_caps():
    time = FakeTime()
    db = CappedDatabase(time)
    rt = channel(time, 1)
    db.add_tenant(1, A, 10)
    run_tick(time, db, [rt])
    assert db.caps_seen and all(c is None for c in db.caps_seen)
    assert CONF.TENANT_RATE_LIMITS == {}
