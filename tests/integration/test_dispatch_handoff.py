"""The monolith's dispatcher hands over: its own first send recorded by the worker's rules (decide,
backoff, budget, dead-letter fields, outbox event), refused clearly when the row is not its to record."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from notifications_retry import api
from notifications_retry.conf import get_settings
from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due
from notifications_retry.delivery.handoff import lease_fresh
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.worker import Worker
from notifications_retry.exceptions import ChannelConfigurationError, InvalidTransition
from notifications_retry.models import NotificationEntity, Outbox
from notifications_retry.providers import get_provider_class
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)
Status = NotificationEntity.Status
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def fresh(**channel_fields) -> NotificationEntity:
    fields = {
        "key": "email",
        "provider_key": "in_app",
        "max_attempts": 3,
        "retry_backoff": "fixed",
        "backoff_base_seconds": 60,
        **channel_fields,
    }
    return NotificationFactory(channel=ChannelFactory(**fields), status=Status.PENDING)


def events(row: NotificationEntity) -> list[dict]:
    return [e.payload for e in Outbox.objects.filter(key=str(row.pk))]


def test_sent_becomes_sent_with_its_event():
    row = api.record_dispatch_sent(fresh(), provider_message_id="esp-1", now=NOW)
    assert (row.status, row.attempts, row.provider_message_id) == (Status.SENT, 1, "esp-1")
    assert row.claim_token is None and row.next_attempt_at is None
    [event] = events(row)
    assert event["status"] == "Sent" and event["provider_message_id"] == "esp-1" and event["attempts"] == 1


def test_a_temporary_failure_goes_to_the_worker_after_the_backoff():
    row = api.record_dispatch_failure(fresh(), error="SMTP 451 try later", now=NOW, rng=random.Random(1))
    assert (row.status, row.attempts, row.error_kind) == (Status.FAILED, 1, "dispatch_failed")
    assert row.dead_lettered_at is None
    assert timedelta(seconds=54) <= row.next_attempt_at - NOW <= timedelta(seconds=66)  # 60 s +-10 % jitter
    assert events(row) == []  # an intermediate failure emits nothing
    assert row.attempt_log[-1]["outcome"] == "retry"


def test_retry_after_is_honoured():
    row = api.record_dispatch_failure(fresh(), error="429", error_kind="throttled", retry_after=900, now=NOW)
    assert row.next_attempt_at - NOW >= timedelta(seconds=900)


def test_a_permanent_failure_is_a_dead_letter_with_its_event():
    row = api.record_dispatch_failure(
        fresh(), error="550 no such user", error_kind="smtp_550", retriable=False, now=NOW
    )
    assert row.status == Status.FAILED and row.dead_lettered_at == NOW
    assert row.dead_letter_reason == "smtp_550: 550 no such user"
    [event] = events(row)
    assert event["status"] == "Failed" and event["error_kind"] == "smtp_550"


def test_the_attempt_budget_applies_to_the_dispatchers_attempt():
    row = api.record_dispatch_failure(fresh(max_attempts=1), error="timeout", now=NOW)
    assert row.dead_lettered_at is not None, "the only allowed attempt failed: terminal"
    assert len(events(row)) == 1


def test_the_worker_takes_over_a_handed_over_row(clock):
    row = api.record_dispatch_failure(fresh(), error="connection refused", now=clock.now())
    clock.advance(120)
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        stats = worker.tick()
    finally:
        worker.close()
    row.refresh_from_db()
    assert stats.sent == 1 and row.status == Status.SENT and row.attempts == 2
    assert [e["status"] for e in events(row)] == ["Sent"]


def test_bad_input_is_refused_and_changes_nothing():
    row = fresh()
    with pytest.raises(InvalidTransition, match="no such notification"):
        api.record_dispatch_sent(uuid.uuid4(), now=NOW)
    with pytest.raises(ValueError, match="aware datetime"):
        api.record_dispatch_sent(row, now=datetime(2026, 1, 1, 12, 0))  # naive
    with pytest.raises(ValueError, match="UUID"):
        api.record_dispatch_sent("not-a-uuid", now=NOW)
    with pytest.raises(ValueError, match=r"^error: must not be empty"):
        api.record_dispatch_failure(row, error="", now=NOW)
    with pytest.raises(ValueError, match="retry_after"):
        api.record_dispatch_failure(row, error="x", retry_after=-1, now=NOW)
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Status.PENDING, 0)
    api.record_dispatch_sent(row, now=NOW)
    with pytest.raises(InvalidTransition, match="sent, not pending"):
        api.record_dispatch_sent(row, now=NOW)
    with pytest.raises(InvalidTransition, match="not pending"):
        api.record_dispatch_failure(row, error="late", now=NOW)
    assert len(events(row)) == 1


def test_a_row_a_worker_holds_is_refused(clock):
    row = fresh()
    # Scheduled for now, so the worker's claim takes it (and leases it).
    NotificationEntity.objects.filter(pk=row.pk).update(scheduled_at=clock.now() - timedelta(seconds=1))
    batch = claim_due(
        ClaimRequest(
            clock.now(),
            [ChannelClaim(row.channel_id, 10, 60.0)],
            total=10,
            budgets={row.channel_id: (3, "email")},
        )
    )
    assert [r.id for r in batch.records] == [row.pk]
    with pytest.raises(InvalidTransition, match="a worker is sending it now"):
        api.record_dispatch_sent(row, now=clock.now())
    row.refresh_from_db()
    assert row.status == Status.PENDING and row.claim_token == batch.records[0].claim_token


def test_send_now_delivers_through_the_channels_provider(webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    webhook_server.responder = lambda r: Reply(200, {"id": "hook-7"})
    row = fresh(key="hook", provider_key="webhook", options={"url": webhook_server.url})
    row = api.send_now(row)
    assert (row.status, row.attempts, row.provider_message_id) == (Status.SENT, 1, "hook-7")
    assert row.claim_token is None
    assert len(webhook_server.requests) == 1
    assert webhook_server.requests[0].headers["idempotency-key"] == str(row.pk)
    assert [e["status"] for e in events(row)] == ["Sent"]


def test_send_now_records_a_failure_for_the_worker(webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    webhook_server.responder = lambda r: Reply(503, {"error": "down"})
    row = api.send_now(fresh(key="hook", provider_key="webhook", options={"url": webhook_server.url}))
    assert row.status == Status.FAILED and row.attempts == 1 and row.next_attempt_at is not None
    assert row.claim_token is None and row.dead_lettered_at is None
    assert events(row) == []


def test_send_now_does_not_call_the_provider_for_a_suppressed_recipient(webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    webhook_server.responder = lambda r: Reply(200, {"id": "hook-7"})
    row = fresh(key="hook", provider_key="webhook", options={"url": webhook_server.url})
    api.suppress(row.recipient.replace("@example.com", "@EXAMPLE.com"), channel="hook")
    row = api.send_now(row)
    assert (row.status, row.error_kind, row.attempts) == (Status.FAILED, "suppressed", 0)
    assert row.dead_lettered_at is not None and row.claim_token is None
    assert webhook_server.requests == []
    assert [(e["status"], e["error_kind"]) for e in events(row)] == [("Failed", "suppressed")]


def test_send_now_refuses_to_call_a_provider_inside_a_transaction():
    row = fresh()
    with transaction.atomic(), pytest.raises(InvalidTransition, match="inside a database transaction"):
        api.send_now(row)
    row.refresh_from_db()
    assert (row.status, row.attempts, row.claim_token) == (Status.PENDING, 0, None)


def test_a_send_now_lease_is_as_long_as_a_workers_claim_of_the_same_channel():
    row = fresh(timeout_seconds=7)
    record, channel = lease_fresh(row.pk, now=NOW)
    provider = get_provider_class(channel.provider_key)(channel.settings())
    worker_side = ChannelRuntime(channel, provider, get_settings(), max_concurrency=1, rate_limit=None)
    assert record.lease_expires_at == NOW + timedelta(seconds=worker_side.lease_seconds(get_settings()))


@pytest.mark.parametrize(
    ("provider_key", "options", "problem"),
    [
        ("webhook", {"url": "http://[::1"}, "url"),  # urlsplit raises on it
        ("no_such_provider", {}, "unknown provider key"),
        ("webhook", ["not", "an", "object"], "options"),
    ],
)
def test_send_now_on_a_channel_that_cannot_work_gives_the_row_back(provider_key, options, problem):
    # Rows written past the admin (raw SQL, a restore): the channel's problem, not the row's.
    row = fresh(key="hook")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notifications_retry_channelconfig SET provider_key = %s, options = %s::jsonb"
            " WHERE id = %s",
            [provider_key, json.dumps(options), row.channel_id],
        )
    with pytest.raises(ChannelConfigurationError, match=f"channel 'hook' cannot send: .*{problem}"):
        api.send_now(row)
    row.refresh_from_db()
    assert (row.status, row.attempts, row.claim_token) == (Status.PENDING, 0, None)
    assert events(row) == []
