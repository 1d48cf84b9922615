"""``TENANT_RATE_LIMITS`` end to end: a real tick on PostgreSQL, a webhook receiver on 127.0.0.1.

A limited tenant's requests arrive evenly spaced at its rate while an unlimited tenant's drain at once
beside them, and a tenant at its limit is left due in the table, not leased and given back."""

from __future__ import annotations

import random
import uuid

import pytest

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory
from tests.support.arrivals import max_in_window
from tests.support.due_rows import due_rows

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)


def due(clock, channel, tenant, count):
    return due_rows(clock, channel, tenant, count, ago=60, spread=0.001)


def arrivals_by_tenant(webhook_server):
    tenant_of = {str(n.pk): n.tenant_id for n in NotificationEntity.objects.all()}
    arrivals: dict[uuid.UUID | None, list[float]] = {}
    for request in webhook_server.requests:
        arrivals.setdefault(tenant_of[request.json()["notification_id"]], []).append(request.received_at)
    return arrivals


def tick(clock, settings, limits, **options):
    """One tick of a worker whose settings add ``limits`` (the receiver's allowlist kept)."""
    settings.NOTIFICATIONS_RETRY = {**settings.NOTIFICATIONS_RETRY, "TENANT_RATE_LIMITS": limits}
    worker = Worker(clock=clock, rng=random.Random(3), batch_size=1000, **options)
    try:
        return worker.tick()
    finally:
        worker.close()


def test_a_limited_tenant_arrives_at_its_rate_while_an_unlimited_one_drains_beside_it(
    clock, settings, webhook_server
):
    channel = ChannelFactory(
        key="hooks", provider_key="webhook", options={"url": webhook_server.url}, max_concurrency=16
    )
    due(clock, channel, A, 40)
    due(clock, channel, None, 10)
    due(clock, channel, B, 40)
    rate = 20
    stats = tick(clock, settings, {"*": rate, str(B): None})
    # One tick sends them all: a claim cut short by a tenant's limit does not end it.
    assert stats.sent == 90
    assert NotificationEntity.objects.filter(status=Status.SENT).count() == 90
    arrivals = arrivals_by_tenant(webhook_server)
    assert [len(arrivals[t]) for t in (A, None, B)] == [40, 10, 40]
    for tenant in (A, None):  # the null tenant is limited by "*" too
        assert max_in_window(arrivals[tenant]) <= rate * 1.05, tenant
    # Limited, not merely slow: A's 40 took about 39 intervals.
    assert max(arrivals[A]) - min(arrivals[A]) >= 39 / rate * 0.95
    # B, unlimited, did not wait behind A's slots: all of it arrived within A's first second.
    assert max(arrivals[B]) < min(arrivals[A]) + 1.0


def test_a_tenant_at_its_limit_stays_due_in_the_table_while_others_are_claimed(
    clock, settings, webhook_server
):
    channel = ChannelFactory(key="hooks", provider_key="webhook", options={"url": webhook_server.url})
    held = due(clock, channel, A, 30)
    others = due(clock, channel, B, 5)
    stats = tick(clock, settings, {str(A): 2}, max_duration=0.6)
    # In 0.6 s A may start 2 (at 0 and 0.5 s); the claims took no more of its rows than that and a
    # horizon's worth, so the rest were never leased nor released: untouched, still on attempt 1.
    assert stats.sent >= 5 + 1
    assert NotificationEntity.objects.filter(pk__in=[r.pk for r in others], status=Status.SENT).count() == 5
    untouched = NotificationEntity.objects.filter(pk__in=[r.pk for r in held], attempts=1, claim_token=None)
    assert untouched.count() >= 30 - 3
    assert len(arrivals_by_tenant(webhook_server)[A]) <= 2
