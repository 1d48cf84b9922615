"""Per-type attempt budgets (one documented setting) and deadlines of stale sends."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from notifications_retry.delivery import attempt_budget
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

Status = NotificationEntity.Status


@pytest.mark.parametrize(
    ("channel", "ntype", "expected"),
    [
        ("email", "transactional", 8),  # "channel:type" wins over "type"
        ("sms", "transactional", 6),
        ("sms", "marketing", 2),
        ("sms", "other", 5),  # unknown type: the channel's max_attempts
        ("sms", "", 5),
    ],
)
def test_budget_precedence(channel, ntype, expected):
    by_type = {"transactional": 6, "email:transactional": 8, "marketing": 2}
    assert attempt_budget(5, channel, ntype, by_type) == expected


def run_until_dead(clock, row):
    worker = Worker(clock=clock, rng=random.Random(2))
    for _ in range(20):
        worker.tick()
        row.refresh_from_db()
        if row.dead_lettered_at is not None:
            break
        clock.set(row.next_attempt_at + timedelta(seconds=1))
    worker.close()
    return row


@pytest.mark.django_db
def test_transactional_gets_more_attempts_than_marketing_on_one_channel(clock, settings):
    # A high circuit threshold: this test is about budgets, not about the breaker pausing the channel.
    settings.NOTIFICATIONS_RETRY = {
        "ATTEMPTS_BY_TYPE": {"transactional": 6, "marketing": 2},
        "CIRCUIT_BREAKER": {"failure_threshold": 1000},
    }
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=4)
    due = {"status": Status.FAILED, "attempts": 0, "next_attempt_at": clock.now()}
    rows = {
        t: NotificationFactory(channel=channel, notification_type=t, **due)
        for t in ("transactional", "marketing", "")
    }
    for ntype, attempts in (("transactional", 6), ("marketing", 2), ("", 4)):
        row = run_until_dead(clock, rows[ntype])
        assert row.attempts == attempts, ntype
        assert Outbox.objects.get(key=str(row.pk)).payload["attempts"] == attempts


@pytest.mark.django_db
def test_a_deadline_in_the_future_does_not_stop_the_send(clock):
    row = NotificationFactory(
        channel=ChannelFactory(key="in_app"),
        scheduled_at=clock.now(),
        expires_at=clock.now() + timedelta(seconds=1),
    )
    Worker(clock=clock, rng=random.Random(2)).tick()
    row.refresh_from_db()
    assert row.status == Status.SENT


@pytest.mark.django_db
def test_a_retry_whose_deadline_passes_meanwhile_expires_instead_of_sending(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=5)
    row = NotificationFactory(
        channel=channel, scheduled_at=clock.now(), expires_at=clock.now() + timedelta(seconds=90)
    )
    worker = Worker(clock=clock, rng=random.Random(2))
    worker.tick()
    row.refresh_from_db()
    assert row.status == Status.FAILED and row.attempts == 1 and row.dead_lettered_at is None
    channel.provider_key, channel.options = "in_app", {}
    channel.save()
    clock.set(row.next_attempt_at + timedelta(seconds=1))  # backoff ~60 s + the deadline is 90 s: past
    if clock.now() <= row.expires_at:
        clock.set(row.expires_at + timedelta(seconds=1))
    worker.tick()
    worker.close()
    row.refresh_from_db()
    assert row.status == Status.FAILED and row.error_kind == "expired"
    assert row.provider_message_id is None and row.attempts == 1
    (event,) = Outbox.objects.filter(key=str(row.pk))
    assert event.payload["error_kind"] == "expired"
