"""The dead-letter lifecycle: kept whole, requeued with a fresh budget (audited), discarded, expired."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest

from notifications_retry import api
from notifications_retry.delivery import triage
from notifications_retry.engine.worker import Worker
from notifications_retry.models import DeadLetterAction, NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status


def tick(clock):
    worker = Worker(clock=clock, rng=random.Random(5))
    try:
        return worker.tick()
    finally:
        worker.close()


def dead_letter_by_worker(clock, channel, **fields):
    """A notification the worker itself made a dead letter (the real path, with its event)."""
    fields.setdefault("next_attempt_at", clock.now() - timedelta(seconds=1))
    fields.setdefault("attempts", 0)
    row = NotificationFactory(channel=channel, status=Status.FAILED, **fields)
    for _ in range(10):
        tick(clock)
        row.refresh_from_db()
        if row.dead_lettered_at is not None:
            return row
        clock.set(row.next_attempt_at + timedelta(seconds=1))
    raise AssertionError("never became a dead letter")


def test_a_dead_letter_is_kept_whole_with_its_attempt_history(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=3)
    row = dead_letter_by_worker(
        clock,
        channel,
        payload={"subject": "Code", "body": "123456"},
        recipient="ann@example.com",
        notification_type="transactional",
    )
    summary = triage.dead_letter_summary(row.pk)
    assert (summary.channel, summary.recipient, summary.payload) == (
        "email",
        "ann@example.com",
        {"subject": "Code", "body": "123456"},
    )
    assert summary.status == Status.FAILED and summary.error_kind == "stub_retriable"
    assert "stub told to fail" in summary.last_error and summary.dead_letter_reason
    assert summary.dead_lettered_at == clock.now()
    (run,) = summary.history
    assert (run.generation, run.attempts, run.outcome) == (0, 3, "terminal")
    assert run.error_kinds == {"stub_retriable": 3}
    assert run.first_at < run.last_at


def test_requeue_gives_a_fresh_budget_keeps_the_id_and_is_audited(clock, webhook_server):
    refuse = {"on": True}
    webhook_server.responder = lambda r: Reply(400) if refuse["on"] else Reply(200, {"id": "prov-1"})
    channel = ChannelFactory(
        key="webhook", provider_key="webhook", options={"url": webhook_server.url}, max_attempts=3
    )
    row = dead_letter_by_worker(clock, channel)
    assert row.error_kind == "http_4xx" and row.attempts == 1

    clock.advance(3600)
    result = triage.requeue([row.pk], actor="alice", reason="endpoint fixed", now=clock.now())
    assert result.done == [row.pk] and not result.refused
    row.refresh_from_db()
    assert (row.status, row.attempts, row.requeue_count) == (Status.FAILED, 0, 1)
    assert row.dead_lettered_at is None and row.resolution == "" and row.due_at == clock.now()
    (action,) = DeadLetterAction.objects.filter(notification=row)
    assert (action.action, action.actor, action.reason, action.attempts_before, action.created_at) == (
        "requeue",
        "alice",
        "endpoint fixed",
        1,
        clock.now(),
    )

    refuse["on"] = False
    tick(clock)
    row.refresh_from_db()
    assert row.status == Status.SENT and row.provider_message_id == "prov-1"
    # Same NotificationId, so the provider can drop a duplicate: the key never changed.
    assert webhook_server.keys() == [str(row.pk), str(row.pk)]
    events = list(Outbox.objects.filter(key=str(row.pk)).order_by("id"))
    assert [(e.generation, e.payload["status"]) for e in events] == [(0, "Failed"), (1, "Sent")]
    assert events[1].payload["attempts"] == 1
    assert [r.generation for r in triage.dead_letter_summary(row).history] == [0, 1]


def test_a_requeued_record_gets_its_whole_budget_again(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"ATTEMPTS_BY_TYPE": {"marketing": 2}}
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=5)
    row = dead_letter_by_worker(clock, channel, notification_type="marketing")
    assert row.attempts == 2  # the type's budget, not the channel's 5
    triage.requeue([row.pk], actor="bob", now=clock.now())
    for _ in range(5):
        tick(clock)
        row.refresh_from_db()
        if row.dead_lettered_at is not None:
            break
        clock.set(row.next_attempt_at + timedelta(seconds=1))
    assert row.dead_lettered_at is not None and row.attempts == 2 and row.requeue_count == 1
    assert [run.attempts for run in triage.dead_letter_summary(row).history] == [2, 2]
    assert list(
        Outbox.objects.filter(key=str(row.pk)).values_list("generation", flat=True).order_by("id")
    ) == [0, 1]


def test_requeue_refuses_what_it_must_not_touch_and_changes_nothing(clock):
    channel = ChannelFactory(key="in_app")
    alive = NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=clock.now() + timedelta(minutes=5)
    )
    sent = NotificationFactory(channel=channel, status=Status.SENT, attempts=1)
    cancelled = NotificationFactory(channel=channel)
    api.cancel_notification(cancelled.pk, actor="shop", now=clock.now())
    expired = NotificationFactory(
        channel=channel,
        scheduled_at=clock.now() - timedelta(minutes=1),
        expires_at=clock.now() - timedelta(seconds=1),
    )
    tick(clock)
    expired.refresh_from_db()
    assert expired.error_kind == "expired" and expired.dead_lettered_at is not None
    missing = uuid.uuid4()
    ids = [alive.pk, sent.pk, cancelled.pk, expired.pk, missing]
    before = list(NotificationEntity.objects.order_by("pk").values())
    audit_before = DeadLetterAction.objects.count()
    result = triage.requeue(ids, actor="eve", now=clock.now())
    assert result.done == []
    assert "not a dead letter (status failed)" in result.refused[alive.pk]
    assert "not a dead letter (status sent)" in result.refused[sent.pk]
    assert "cancelled" in result.refused[cancelled.pk]
    assert "deadline" in result.refused[expired.pk]
    assert result.refused[missing] == "no such notification"
    assert list(NotificationEntity.objects.order_by("pk").values()) == before
    assert DeadLetterAction.objects.count() == audit_before


def test_requeue_twice_counts_once(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"})
    row = dead_letter_by_worker(clock, channel)
    assert triage.requeue([row.pk], actor="a", now=clock.now()).done == [row.pk]
    second = triage.requeue([row.pk], actor="a", now=clock.now())
    assert "not a dead letter" in second.refused[row.pk]
    row.refresh_from_db()
    assert row.requeue_count == 1


def test_discard_resolves_without_sending_and_is_audited(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"})
    row = dead_letter_by_worker(clock, channel)
    events_before = Outbox.objects.count()
    result = triage.discard([row.pk], actor="carol", reason="customer left", now=clock.now())
    assert result.done == [row.pk]
    row.refresh_from_db()
    assert (row.status, row.resolution, row.resolved_at) == (Status.FAILED, "discarded", clock.now())
    assert row.dead_lettered_at is not None and row.due_at is None
    action = DeadLetterAction.objects.get(notification=row, action="discard")
    assert (action.actor, action.reason) == ("carol", "customer left")
    assert Outbox.objects.count() == events_before  # the outcome's event was already emitted
    assert "already discarded" in triage.discard([row.pk], actor="carol", now=clock.now()).refused[row.pk]
    clock.advance(86400)
    assert tick(clock).processed == 0


def test_expiry_marks_only_old_unresolved_dead_letters_unresolvable(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"})
    old = dead_letter_by_worker(clock, channel)
    discarded = dead_letter_by_worker(clock, channel)
    triage.discard([discarded.pk], actor="x", now=clock.now())
    clock.advance(10 * 86400)
    young = dead_letter_by_worker(clock, channel)
    count = triage.expire_dead_letters(retention=timedelta(days=5), now=clock.now())
    assert count == 1
    old.refresh_from_db()
    assert (old.status, old.resolution, old.resolved_at) == (Status.FAILED, "unresolvable", clock.now())
    action = DeadLetterAction.objects.get(notification=old, action="expire")
    assert action.actor == "system"
    for other, resolution in ((discarded, "discarded"), (young, "")):
        other.refresh_from_db()
        assert other.resolution == resolution
    # An expired dead letter can still be requeued by an operator who decides to send it after all.
    assert triage.requeue([old.pk], actor="x", now=clock.now()).done == [old.pk]


def test_no_triage_operation_changes_a_status(clock):
    """INV-NTF-5: requeue, discard and expiry keep a dead letter Failed; only the worker sends."""
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"})
    rows = [dead_letter_by_worker(clock, channel) for _ in range(3)]
    triage.requeue([rows[0].pk], actor="a", now=clock.now())
    triage.discard([rows[1].pk], actor="a", now=clock.now())
    triage.expire_dead_letters(retention=timedelta(seconds=1), now=clock.now() + timedelta(days=1))
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.FAILED}
