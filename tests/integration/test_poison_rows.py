"""Due rows the claim cannot read or lease never stop the healthy rows beside them.

Rows written by other code or raw SQL: a deadline of 'infinity' or year 12000 (PostgreSQL accepts both,
Python's datetime cannot hold them), and a Sent row with a live lease (an INSERT can write one; the
triggers refuse every later change of a Sent row, so the claim's UPDATE fails on it).
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status


def healthy(clock, channel, n=5):
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=9),
        )
        for _ in range(n)
    ]


def tick(clock):
    worker = Worker(clock=clock, rng=random.Random(3))
    try:
        return worker.tick()
    finally:
        worker.close()


@pytest.mark.parametrize("deadline", ["infinity", "12000-01-01 00:00+00", "-infinity"])
def test_a_deadline_python_cannot_hold_does_not_stop_the_tick(clock, deadline):
    channel = ChannelFactory(key="in_app", provider_key="in_app")
    odd = NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=clock.now() - timedelta(seconds=10)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notifications_retry_notificationentity SET expires_at = %s::timestamptz WHERE id = %s",
            [deadline, odd.pk],
        )
    rows = healthy(clock, channel)
    stats = tick(clock)
    assert stats.error == "" and stats.poisoned == 0
    for row in rows:
        row.refresh_from_db()
        assert row.status == Status.SENT
    # A deadline that far ahead is no deadline; one that far back has passed.
    status, kind = NotificationEntity.objects.filter(pk=odd.pk).values_list("status", "error_kind").get()
    assert (status, kind) == ((Status.FAILED, "expired") if deadline == "-infinity" else (Status.SENT, ""))
    # Stored as the bound it was read as, so the admin and the API can load the row.
    odd.refresh_from_db()
    assert odd.expires_at.year == (1 if deadline == "-infinity" else 9999)


def test_a_sent_row_with_a_live_lease_is_set_aside_and_the_rest_is_sent(clock):
    channel = ChannelFactory(key="in_app", provider_key="in_app")
    poison = NotificationFactory(channel=channel, status=Status.PENDING)
    # What an INSERT by other code can leave: Sent, with a lease that has run out (so it looks due).
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM notifications_retry_notificationentity WHERE id = %s RETURNING id", [poison.pk]
        )
        cursor.execute(
            """
            INSERT INTO notifications_retry_notificationentity (
                id, tenant_id, recipient, payload, notification_type, priority, status, attempts,
                last_error, error_kind, attempt_log, dead_letter_reason, resolution, requeue_count,
                correlation_id, created_at, updated_at, channel_id, claim_token, claim_expires_at)
            VALUES (%s, NULL, 'r', '{}', '', 5, 'sent', 1, '', '', '[]', '', '', 0, '', %s, %s, %s,
                    gen_random_uuid(), %s)
            """,
            [poison.pk, clock.now(), clock.now(), channel.pk, clock.now() - timedelta(seconds=30)],
        )
    rows = healthy(clock, channel)
    before = REGISTRY.get_sample_value("notifications_retry_poisoned_rows_total") or 0
    stats = tick(clock)
    assert stats.error == "" and stats.poisoned == 1 and stats.sent == 5
    assert REGISTRY.get_sample_value("notifications_retry_poisoned_rows_total") == before + 1
    for row in rows:
        row.refresh_from_db()
        assert row.status == Status.SENT
    # The next tick of the same worker does not trip over it again; a new one sets it aside again.
    more = healthy(clock, channel, 2)
    worker = Worker(clock=clock, rng=random.Random(3))
    try:
        first, second = worker.tick(), worker.tick()
    finally:
        worker.close()
    assert first.poisoned == 1 and first.sent == 2
    assert second.poisoned == 0 and second.error == ""
    assert all(NotificationEntity.objects.get(pk=r.pk).status == Status.SENT for r in more)
