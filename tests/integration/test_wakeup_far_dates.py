"""Rows with times Python's datetime cannot hold, beside a lane's other rows, on real PostgreSQL.

PostgreSQL stores 'infinity', '-infinity' and year 12000, which raw SQL (or other code) can write;
psycopg refuses to read them ("timestamp too large"). The worker's wait between ticks reads the
lane's earliest due time: such a row must read as far away (or, before year 1, as due now), never
fail the question, and never keep the lane's other rows from being claimed and sent.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from notifications_retry.database.locks import AdvisoryLock
from notifications_retry.engine.wakeup import LockConnectionPort, Wake
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)
Status = NotificationEntity.Status
TABLE = NotificationEntity._meta.db_table

#: What a time past datetime's range reads as: the claim's own bound for a deadline that far ahead.
FAR = datetime(9999, 12, 30, tzinfo=UTC)
#: What a time before year 1 reads as: long due.
LONG_AGO = datetime(1, 1, 2, tzinfo=UTC)
YEAR_12000 = "12000-01-01 00:00+00"


@pytest.fixture
def lock() -> Iterator[AdvisoryLock]:
    held = AdvisoryLock("tests:wakeup-far-dates")
    yield held
    held.close()


def set_column(pk: object, column: str, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET {column} = %s::timestamptz WHERE id = %s", [value, pk])


def failed(channel: object, seconds: float) -> NotificationEntity:
    """A Failed row due ``seconds`` from now (negative: due already)."""
    return NotificationFactory(
        channel=channel,
        status=Status.FAILED,
        attempts=1,
        next_attempt_at=timezone.now() + timedelta(seconds=seconds),
    )


@pytest.mark.parametrize(
    ("column", "status", "value", "reads_as"),
    [
        ("next_attempt_at", Status.FAILED, YEAR_12000, FAR),
        ("next_attempt_at", Status.FAILED, "infinity", FAR),
        ("scheduled_at", Status.PENDING, YEAR_12000, FAR),
        ("claim_expires_at", Status.FAILED, YEAR_12000, FAR),  # a lease written by raw SQL
        ("next_attempt_at", Status.FAILED, "-infinity", LONG_AGO),
    ],
)
def test_the_earliest_due_time_reads_a_time_python_cannot_hold(
    lock: AdvisoryLock, column: str, status: str, value: str, reads_as: datetime
) -> None:
    channel = ChannelFactory(key="app")
    row = NotificationFactory(channel=channel, status=status, attempts=1)
    if column == "claim_expires_at":  # leased: a token and an expiry, no due time
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {TABLE} SET claim_token = gen_random_uuid() WHERE id = %s", [row.pk])
    set_column(row.pk, column, value)
    port = LockConnectionPort(lock, channels=None, priorities=None)
    assert port.earliest_due(None) == reads_as
    # Beside a row due in 30 s, a row in year 12000 is the later one; one before year 1 the earlier.
    soon = failed(channel, 30).next_attempt_at
    assert port.earliest_due(None) == min(soon, reads_as)
    assert port.earliest_due(soon) == (reads_as if reads_as > soon else None)


def test_a_worker_beside_year_12000_rows_waits_without_failing_and_sends_the_others() -> None:
    channel = ChannelFactory(key="app", provider_key="in_app")
    retry, scheduled = failed(channel, 0), NotificationFactory(channel=channel, status=Status.PENDING)
    set_column(retry.pk, "next_attempt_at", YEAR_12000)
    set_column(scheduled.pk, "scheduled_at", YEAR_12000)
    worker = Worker(rng=random.Random(5))
    try:
        started = time.monotonic()
        assert worker.waiter.wait(until=started + 0.5) is Wake.INTERVAL, "nothing due: the wait ran out"
        assert worker.waiter.failures == 0 and worker.waiter.error is None
        others = [failed(channel, -5) for _ in range(5)]
        assert worker.waiter.wait(until=time.monotonic() + 10) is Wake.DUE
        stats = worker.tick()
    finally:
        worker.close()
    assert stats.error == "" and stats.poisoned == 0 and stats.sent == 5
    assert set(
        NotificationEntity.objects.filter(pk__in=[o.pk for o in others]).values_list("status", flat=True)
    ) == {Status.SENT}
    # Never due: they wait untouched.
    far = NotificationEntity.objects.filter(pk__in=[retry.pk, scheduled.pk])
    assert set(far.values_list("status", "attempts", "claim_token")) == {
        (Status.FAILED, 1, None),
        (Status.PENDING, scheduled.attempts, None),
    }


@pytest.mark.parametrize("provider", ["in_app", "webhook"])  # the claim on Django's connection, and beside it
def test_a_due_row_with_its_other_times_in_year_12000_is_claimed_and_sent_beside_the_others(
    webhook_server: object, provider: str
) -> None:
    options = {"url": webhook_server.url} if provider == "webhook" else {}  # type: ignore[attr-defined]
    channel = ChannelFactory(key="app", provider_key=provider, options=options)
    odd = failed(channel, -10)
    for column in ("created_at", "updated_at", "scheduled_at", "expires_at", "resolved_at"):
        set_column(odd.pk, column, YEAR_12000)
    others = [failed(channel, -5) for _ in range(5)]
    worker = Worker(rng=random.Random(5))
    try:
        stats = worker.tick()
    finally:
        worker.close()
    assert stats.error == "" and stats.poisoned == 0 and stats.sent == 6
    ids = [odd.pk, *(o.pk for o in others)]
    assert set(NotificationEntity.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        Status.SENT
    }


def test_queue_statistics_read_a_due_time_before_year_one_as_long_due() -> None:
    """A ``-infinity`` due row (on a disabled channel, so it stays due) must not fail the backlog
    statistics every tick writes with the heartbeat, nor the status breakdown of the dashboard."""
    paused = ChannelFactory(key="paused_far", provider_key="in_app", is_enabled=False)
    row = failed(paused, -60)
    set_column(row.pk, "next_attempt_at", "-infinity")
    set_column(row.pk, "created_at", "-infinity")
    now = timezone.now()
    figures = NotificationEntity.objects.backlog(now)
    assert figures.due == 1
    assert figures.oldest_due_age_seconds == (now - LONG_AGO).total_seconds()
    assert [r.count for r in NotificationEntity.objects.status_breakdown(now)] == [1]
