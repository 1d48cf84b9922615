"""Wake-ups on real PostgreSQL: which committed writes NOTIFY a listening worker, and its next due time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from notifications_retry import api
from notifications_retry.database.locks import AdvisoryLock
from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due, finalize, release
from notifications_retry.engine.wakeup import LockConnectionPort
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.rules.outcomes import RETRY, Outcome
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)

#: Long enough for a notification committed before the wait to arrive; a missing one fails the test.
ARRIVAL_SECONDS = 10.0
#: How long a test waits to see that no notification comes (one that was sent is there within ms).
SILENCE_SECONDS = 0.5


@pytest.fixture
def lock() -> Iterator[AdvisoryLock]:
    held = AdvisoryLock("tests:wakeup")
    yield held
    held.close()


def listening(lock: AdvisoryLock, **scope: object) -> LockConnectionPort:
    """A port LISTENing already, with every notification so far consumed."""
    port = LockConnectionPort(lock, channels=scope.get("channels"), priorities=scope.get("priorities"))  # type: ignore[arg-type]
    port.earliest_due(None)
    while port.notified(SILENCE_SECONDS):
        pass
    return port


def test_a_scheduled_row_wakes_the_worker_and_sets_its_next_due_time(lock: AdvisoryLock) -> None:
    channel = ChannelFactory(key="app")
    port = listening(lock)
    assert port.earliest_due(None) is None
    send_at = timezone.now() + timedelta(seconds=30)
    api.schedule_notification(channel=channel, recipient="a@example.com", send_at=send_at)
    assert port.notified(ARRIVAL_SECONDS)
    assert port.earliest_due(None) == send_at


def test_a_fresh_row_for_the_monolith_wakes_no_one(lock: AdvisoryLock) -> None:
    channel = ChannelFactory(key="app")
    port = listening(lock)
    api.create_notification(channel=channel, recipient="a@example.com")  # the monolith sends it first
    assert not port.notified(SILENCE_SECONDS)
    assert port.earliest_due(None) is None


def test_a_claim_wakes_no_one_and_a_sooner_retry_or_a_release_does(lock: AdvisoryLock) -> None:
    channel = ChannelFactory(key="app", timeout_seconds=30)
    now = timezone.now()
    for _ in range(3):
        NotificationFactory(
            channel=channel, status=NotificationEntity.Status.FAILED, attempts=1, next_attempt_at=now
        )
    port = listening(lock)
    batch = claim_due(
        ClaimRequest(now, [ChannelClaim(channel.pk, 3, 60.0)], total=3, budgets={channel.pk: (5, "app")})
    )
    assert len(batch.records) == 3
    assert not port.notified(SILENCE_SECONDS)  # due_at cleared: leased
    # A leased row has no due time; its lease's expiry is when the worker looks again.
    assert port.earliest_due(None) == now + timedelta(seconds=60)
    first, second, third = batch.records
    # A retry later than its lease's end wakes no one: the worker wakes at the lease's end anyway.
    later = now + timedelta(minutes=5)
    assert finalize([Outcome(third, RETRY, error_kind="http_5xx", next_attempt_at=later)], now).applied
    assert not port.notified(SILENCE_SECONDS)
    retry_at = now + timedelta(seconds=5)  # sooner than the lease's end
    assert finalize([Outcome(first, RETRY, error_kind="http_5xx", next_attempt_at=retry_at)], now).applied
    assert port.notified(ARRIVAL_SECONDS)
    assert port.earliest_due(None) == retry_at
    assert release([second]) == 1
    assert port.notified(ARRIVAL_SECONDS)
    assert port.earliest_due(None) == now


def test_a_lapsed_lease_wakes_every_worker_and_its_own_channels_claim_takes_it_back(
    lock: AdvisoryLock,
) -> None:
    mine, other = ChannelFactory(key="app", timeout_seconds=30), ChannelFactory(key="other")
    now = timezone.now()
    row = NotificationFactory(
        channel=other, status=NotificationEntity.Status.FAILED, attempts=1, next_attempt_at=now
    )
    claim_due(ClaimRequest(now, [ChannelClaim(other.pk, 1, 5.0)], total=1, budgets={other.pk: (5, "other")}))
    port = listening(lock, channels={"app"})
    # Any channel's lease: every worker wakes at its expiry (one probe of the expiry index).
    assert port.earliest_due(None) == now + timedelta(seconds=5)
    assert port.earliest_due(now + timedelta(seconds=5)) is None, "a tick after it took nothing: not again"
    later = now + timedelta(seconds=6)  # the worker died: its lease lapsed
    # Another channel's claim leaves it to a claim of its own channel.
    assert (
        claim_due(
            ClaimRequest(later, [ChannelClaim(mine.pk, 1, 60.0)], total=1, budgets={mine.pk: (5, "app")})
        ).records
        == []
    )
    row.refresh_from_db()
    assert row.claim_expires_at is not None and row.due_at is None
    # Its channel's claim gives it back and takes it in the same transaction, as recovered.
    plan = [ChannelClaim(other.pk, 1, 5.0)]
    (again,) = claim_due(ClaimRequest(later, plan, total=1, budgets={other.pk: (5, "other")})).records
    assert again.id == row.pk and again.attempts == 3
    row.refresh_from_db()
    assert row.claim_expires_at == later + timedelta(seconds=5) and row.due_at is None


def test_a_re_enabled_channel_wakes_the_worker(lock: AdvisoryLock) -> None:
    channel = ChannelFactory(key="app", is_enabled=False)
    NotificationFactory(
        channel=channel, status=NotificationEntity.Status.FAILED, attempts=1, next_attempt_at=timezone.now()
    )
    port = listening(lock)
    assert port.earliest_due(None) is None  # a disabled channel's rows wake no one
    ChannelConfig.objects.filter(pk=channel.pk).update(is_enabled=True)
    assert port.notified(ARRIVAL_SECONDS)
    assert port.earliest_due(None) is not None


def test_the_next_due_time_is_the_lanes_own(lock: AdvisoryLock) -> None:
    now = timezone.now()
    mine, other = ChannelFactory(key="mine"), ChannelFactory(key="other")

    def due(channel: ChannelConfig, seconds: float, priority: int = 5) -> None:
        NotificationFactory(
            channel=channel,
            status=NotificationEntity.Status.FAILED,
            attempts=1,
            priority=priority,
            next_attempt_at=now + timedelta(seconds=seconds),
        )

    due(other, 1)
    due(mine, 3, priority=1)
    due(mine, 5)
    due(mine, 7)
    assert listening(lock).earliest_due(None) == now + timedelta(seconds=1)
    lane = listening(lock, channels={"mine"})
    assert lane.earliest_due(None) == now + timedelta(seconds=3)
    assert lane.earliest_due(now + timedelta(seconds=5)) == now + timedelta(seconds=7)
    assert listening(lock, channels={"mine"}, priorities=[5]).earliest_due(None) == now + timedelta(seconds=5)


def test_a_bulk_insert_wakes_once_per_statement_and_only_with_a_due_row(lock: AdvisoryLock) -> None:
    """A monolith bulk-schedules in one statement: the wake-up runs once over the statement's new rows
    (a row-level trigger made such an INSERT grow faster than its rows), and rows with nothing due
    (handed to the monolith's own first attempt) wake no one."""
    channel = ChannelFactory(key="app")
    port = listening(lock)
    NotificationEntity.objects.bulk_create([NotificationFactory.build(channel=channel) for _ in range(50)])
    assert not port.notified(SILENCE_SECONDS)
    send_at = timezone.now() + timedelta(seconds=30)
    scheduled = [NotificationFactory.build(channel=channel, scheduled_at=send_at) for _ in range(500)]
    NotificationEntity.objects.bulk_create(scheduled)
    assert port.notified(ARRIVAL_SECONDS)
    assert not port.notified(SILENCE_SECONDS)  # one notification for the 500 rows
    assert port.earliest_due(None) == send_at
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgtype & 1 FROM pg_trigger WHERE tgname LIKE 'pgtrigger_nr_wakeup_on_insert_%'"
        )
        assert cursor.fetchone() == (0,)  # bit 0 clear: FOR EACH STATEMENT


def test_a_relaying_worker_s_poll_also_tells_whether_an_outbox_event_waits(lock: AdvisoryLock) -> None:
    """One statement answers both: when the next row falls due, and whether the relay has work."""
    from notifications_retry.models import Outbox

    seen: list[bool] = []
    port = LockConnectionPort(lock, channels=None, priorities=None, on_outbox=seen.append)
    assert port.earliest_due(None) is None and seen == [False]
    channel = ChannelFactory(key="app")
    row = NotificationFactory(channel=channel)
    api.cancel_notification(row.pk, actor="shop")  # writes an outbox event, and no row falls due
    assert Outbox.objects.filter(published_at__isnull=True).exists()
    assert port.earliest_due(None) is None and seen == [False, True]
    Outbox.objects.update(published_at=timezone.now())
    send_at = timezone.now() + timedelta(seconds=30)
    api.schedule_notification(channel=channel, recipient="a@example.com", send_at=send_at)
    assert port.earliest_due(None) == send_at and seen == [False, True, False]
    # Without a relay to tell, the poll asks about rows alone, as before.
    assert listening(lock).earliest_due(None) == send_at
