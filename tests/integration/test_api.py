"""The public API on real PostgreSQL: caller's transaction, on_commit hand-over, cancel, triage, stats."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

import notifications_retry
from notifications_retry import api
from notifications_retry.exceptions import InvalidTransition
from notifications_retry.models import DeadLetterAction, NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)


class Received:
    def __init__(self) -> None:
        self.calls: list[NotificationEntity] = []

    def __call__(self, notification: NotificationEntity, **_: Any) -> None:
        self.calls.append(notification)


def dead_letter(**fields: Any) -> NotificationEntity:
    now = timezone.now()
    return NotificationFactory(
        status=NotificationEntity.Status.FAILED,
        attempts=3,
        dead_lettered_at=now,
        dead_letter_reason="http_4xx: webhook answered HTTP 410",
        error_kind="http_4xx",
        **fields,
    )


def test_the_package_re_exports_the_api() -> None:
    assert notifications_retry.create_notification is api.create_notification
    assert notifications_retry.cancel_notification is api.cancel_notification


def test_create_is_announced_only_after_commit() -> None:
    ChannelFactory(key="in_app")
    received, callback = Received(), Received()
    api.notification_created.connect(received)
    try:
        with transaction.atomic():
            created = api.create_notification(
                channel="in_app", recipient="u1", payload={"body": "hi"}, on_commit=callback
            )
            assert received.calls == [] and callback.calls == []
        assert [n.pk for n in received.calls] == [created.pk]
        assert [n.pk for n in callback.calls] == [created.pk]
    finally:
        api.notification_created.disconnect(received)
    row = NotificationEntity.objects.get(pk=created.pk)
    assert row.status == NotificationEntity.Status.PENDING
    assert row.scheduled_at is None and row.due_at is None  # fresh: the worker never takes it


def test_create_rolls_back_with_the_callers_transaction() -> None:
    ChannelFactory(key="in_app")
    received = Received()
    api.notification_created.connect(received)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            created = api.create_notification(channel="in_app", recipient="u1")
            raise RuntimeError("the order failed to save")
    finally:
        api.notification_created.disconnect(received)
    assert received.calls == []
    assert not NotificationEntity.objects.filter(pk=created.pk).exists()


def test_create_with_an_explicit_id_is_idempotent_by_the_primary_key() -> None:
    ChannelFactory(key="in_app")
    notification_id = uuid.uuid4()
    api.create_notification(channel="in_app", recipient="u1", notification_id=notification_id)
    with pytest.raises(IntegrityError):
        api.create_notification(channel="in_app", recipient="u1", notification_id=notification_id)


def test_create_on_an_unknown_channel_names_it() -> None:
    with pytest.raises(Exception, match="no channel with key 'fax'"):
        api.create_notification(channel="fax", recipient="u1")


def test_schedule_is_due_for_the_worker_and_not_announced() -> None:
    ChannelFactory(key="in_app")
    received = Received()
    api.notification_created.connect(received)
    send_at = timezone.now() + timedelta(hours=8)
    try:
        row = api.schedule_notification(channel="in_app", recipient="u1", send_at=send_at, priority=0)
    finally:
        api.notification_created.disconnect(received)
    assert received.calls == []
    row.refresh_from_db()
    assert row.scheduled_at == send_at and row.due_at == send_at and row.priority == 0


def test_schedule_refuses_a_naive_datetime() -> None:
    ChannelFactory(key="in_app")
    with pytest.raises(ValueError, match="aware"):
        api.schedule_notification(
            channel="in_app", recipient="u1", send_at=timezone.now().replace(tzinfo=None)
        )


def test_cancel_makes_a_pending_notification_terminal_with_a_failed_event() -> None:
    row = NotificationFactory(scheduled_at=timezone.now() + timedelta(hours=1))
    now = timezone.now()
    cancelled = api.cancel_notification(row.pk, actor="orders-service", reason="order refunded", now=now)
    assert cancelled.status == NotificationEntity.Status.FAILED
    assert cancelled.error_kind == api.CANCELLED
    assert cancelled.dead_lettered_at == now and cancelled.due_at is None
    assert cancelled.resolution == NotificationEntity.Resolution.DISCARDED  # not in the triage queue
    assert not NotificationEntity.objects.unresolved_dead_letters().filter(pk=row.pk).exists()
    event = Outbox.objects.get(key=str(row.pk))
    assert event.payload["status"] == "Failed"
    assert event.payload["error_kind"] == "cancelled"
    assert "order refunded" in event.payload["error"]
    audit = DeadLetterAction.objects.get(notification=row)
    assert audit.actor == "orders-service" and audit.action == DeadLetterAction.Action.DISCARD


def test_cancel_is_atomic_with_the_callers_transaction() -> None:
    row = NotificationFactory()
    with pytest.raises(RuntimeError), transaction.atomic():
        api.cancel_notification(row, actor="ops")
        raise RuntimeError("roll back")
    row.refresh_from_db()
    assert row.status == NotificationEntity.Status.PENDING
    assert not Outbox.objects.filter(key=str(row.pk)).exists()


@pytest.mark.parametrize("status", [NotificationEntity.Status.SENT, NotificationEntity.Status.FAILED])
def test_cancel_refuses_anything_but_pending(status: str) -> None:
    row = NotificationFactory(status=status)
    with pytest.raises(InvalidTransition, match=f"it is {status}"):
        api.cancel_notification(row.pk, actor="ops")
    assert not Outbox.objects.filter(key=str(row.pk)).exists()


def test_cancel_refuses_a_record_a_worker_is_sending() -> None:
    row = NotificationFactory(scheduled_at=timezone.now() - timedelta(minutes=1))
    NotificationEntity.objects.filter(pk=row.pk).update(
        claim_token=uuid.uuid4(), claim_expires_at=timezone.now() + timedelta(minutes=1), attempts=1
    )
    with pytest.raises(InvalidTransition, match="sending it now"):
        api.cancel_notification(row.pk, actor="ops")


def test_cancel_takes_over_an_expired_claim() -> None:
    row = NotificationFactory(scheduled_at=timezone.now() - timedelta(minutes=10))
    NotificationEntity.objects.filter(pk=row.pk).update(
        claim_token=uuid.uuid4(), claim_expires_at=timezone.now() - timedelta(minutes=1), attempts=1
    )
    cancelled = api.cancel_notification(row.pk, actor="ops")
    assert cancelled.claim_token is None and cancelled.status == NotificationEntity.Status.FAILED


def test_cancel_of_an_unknown_id() -> None:
    with pytest.raises(InvalidTransition, match="no such notification"):
        api.cancel_notification(uuid.uuid4(), actor="ops")


def test_a_cancelled_notification_cannot_be_sent_later() -> None:
    row = NotificationFactory()
    api.cancel_notification(row.pk, actor="ops")
    # INV-NTF-5 allows failed -> sent for retries; the dead-letter mark keeps the worker away, and
    # the database still refuses a transition that the triggers forbid.
    with pytest.raises(Exception, match="INV-NTF-5"), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notifications_retry_notificationentity SET status = 'pending' WHERE id = %s", [row.pk]
        )


def test_requeue_and_discard_dead_letters_are_audited() -> None:
    first, second, alive = dead_letter(), dead_letter(), NotificationFactory()
    result = api.requeue_dead_letters([first.pk, alive.pk], actor="alice", reason="provider fixed")
    assert result.done == [first.pk]
    assert "not a dead letter" in result.refused[alive.pk]
    first.refresh_from_db()
    assert first.attempts == 0 and first.dead_lettered_at is None and first.requeue_count == 1
    assert first.due_at is not None
    discarded = api.discard_dead_letters([second.pk], actor="bob")
    assert discarded.done == [second.pk]
    second.refresh_from_db()
    assert second.resolution == NotificationEntity.Resolution.DISCARDED
    assert DeadLetterAction.objects.filter(actor__in=["alice", "bob"]).count() == 2


def test_queue_stats_counts_by_status_and_channel() -> None:
    email = ChannelFactory(key="email", provider_key="stub")
    in_app = ChannelFactory(key="in_app")
    now = timezone.now()
    NotificationFactory(
        channel=email, status=NotificationEntity.Status.FAILED, next_attempt_at=now, attempts=1
    )
    NotificationFactory(channel=email, scheduled_at=now - timedelta(minutes=2))
    NotificationFactory(channel=in_app, status=NotificationEntity.Status.SENT)
    NotificationFactory(channel=in_app)  # fresh: not due
    dead_letter(channel=email)
    stats = api.queue_stats(now=now + timedelta(seconds=1))
    assert stats.backlog.due == 2
    assert stats.backlog.failed_backlog == 1
    assert stats.backlog.dead_letters_unresolved == 1
    assert stats.backlog.oldest_due_age_seconds >= 120
    assert stats.count("failed") == 2
    assert stats.count("pending", "in_app") == 1
    assert stats.count("sent") == 1
