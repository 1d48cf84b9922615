"""The suppression list: a suppressed recipient is settled terminal in its claim, with no attempt and no call.

Real PostgreSQL, the real worker tick, and a real HTTP receiver on 127.0.0.1 that must see nothing.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications_retry import api
from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due
from notifications_retry.delivery import suppression as service
from notifications_retry.engine.worker import Worker
from notifications_retry.inputs.validation import normalize_recipient
from notifications_retry.models import (
    ChannelConfig,
    NotificationEntity,
    Outbox,
    Suppression,
    SuppressionChange,
)
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

Status = NotificationEntity.Status


def due(clock, channel, recipient, **fields):
    return NotificationFactory(
        channel=channel,
        recipient=recipient,
        status=Status.FAILED,
        attempts=1,
        next_attempt_at=clock.now() - timedelta(seconds=1),
        **fields,
    )


def tick(clock):
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        worker.tick()
    finally:
        worker.close()


def webhook_channel(server, key="email"):
    return ChannelFactory(key=key, provider_key="webhook", options={"url": server.url}, max_attempts=5)


def assert_suppressed(row, attempts):
    row.refresh_from_db()
    assert (row.status, row.error_kind, row.attempts) == (Status.FAILED, "suppressed", attempts), (
        row.last_error
    )
    assert row.dead_lettered_at is not None
    (event,) = Outbox.objects.filter(key=str(row.pk))
    assert (event.payload["status"], event.payload["error_kind"]) == ("Failed", "suppressed")
    assert event.payload["attempts"] == attempts


@pytest.mark.django_db
def test_a_suppressed_recipient_is_failed_without_an_attempt_or_a_provider_call(clock, webhook_server):
    webhook_server.responder = lambda r: Reply(200, {"id": "x"})
    channel = webhook_channel(webhook_server)
    stopped = due(clock, channel, "gone@example.com")
    sent = due(clock, channel, "here@example.com")
    # Added while the row waits: the claim reads the list, not a flag on the row.
    api.suppress("gone@example.com")
    tick(clock)
    assert_suppressed(stopped, attempts=1)
    sent.refresh_from_db()
    assert sent.status == Status.SENT
    assert [r.json()["recipient"] for r in webhook_server.requests] == ["here@example.com"]
    assert "suppression list" in stopped.last_error and "manual" in stopped.last_error


@pytest.mark.django_db
def test_an_inline_provider_is_not_called_for_a_suppressed_recipient(clock):
    # The stub is inline: it would be settled Sent inside the claim if the check came after it.
    channel = ChannelFactory(key="sms", provider_key="stub", max_attempts=3)
    row = due(clock, channel, "+15550001111")
    api.suppress("+15550001111", channel="sms")
    tick(clock)
    assert_suppressed(row, attempts=1)


@pytest.mark.django_db
def test_a_scheduled_pending_notification_is_suppressed_with_no_attempt(clock):
    channel = ChannelFactory(key="in_app")
    row = NotificationFactory(channel=channel, recipient="user-7", scheduled_at=clock.now())
    api.suppress("user-7", channel="in_app")
    tick(clock)
    assert_suppressed(row, attempts=0)


@pytest.mark.django_db
def test_a_channel_suppression_stops_only_its_channel_and_star_stops_every_channel(clock):
    email = ChannelFactory(key="email", provider_key="stub")
    other = ChannelFactory(key="email-marketing", provider_key="stub")
    api.suppress("ann@example.com", channel="email-marketing")
    kept, stopped = due(clock, email, "ann@example.com"), due(clock, other, "ann@example.com")
    tick(clock)
    kept.refresh_from_db()
    assert kept.status == Status.SENT
    assert_suppressed(stopped, attempts=1)
    api.suppress("bob@example.com")
    rows = [due(clock, email, "bob@example.com"), due(clock, other, "bob@example.com")]
    tick(clock)
    for row in rows:
        assert_suppressed(row, attempts=1)


@pytest.mark.django_db
def test_email_addresses_compare_without_case_and_other_recipients_verbatim(clock):
    channel = ChannelFactory(key="push", provider_key="stub")
    api.suppress("Ann@EXAMPLE.com")
    api.suppress("TokenAbC")
    same_mailbox = due(clock, channel, "Ann <Ann@Example.Com>")
    lower_case = due(clock, channel, " ann@example.com ")  # as ESPs compare: the same mailbox
    other_token = due(clock, channel, "tokenabc")  # a token may tell its cases apart: another one
    tick(clock)
    assert_suppressed(same_mailbox, attempts=1)
    assert_suppressed(lower_case, attempts=1)
    other_token.refresh_from_db()
    assert other_token.status == Status.SENT
    assert set(Suppression.objects.values_list("address", flat=True)) == {"ann@example.com", "TokenAbC"}
    # The address is compared in that form, never sent in it.
    same_mailbox.refresh_from_db()
    assert same_mailbox.recipient == "Ann <Ann@Example.Com>"


@pytest.mark.django_db
def test_an_expired_suppression_stops_nothing(clock):
    channel = ChannelFactory(key="in_app")
    Suppression.objects.create(
        address="late@example.com", reason="hard_bounce", source="test", expires_at=clock.now()
    )
    row = due(clock, channel, "late@example.com")
    tick(clock)
    row.refresh_from_db()
    assert row.status == Status.SENT


@pytest.mark.django_db
def test_the_claim_asks_the_list_once_per_batch_whatever_its_size(clock):
    channel = ChannelFactory(key="email", provider_key="stub", max_attempts=5)
    rows = [due(clock, channel, f"user{i}@example.com") for i in range(60)]
    api.suppress("user3@example.com")
    api.suppress("user40@example.com", channel="email")
    plan = [ChannelClaim(channel.pk, 100, 60.0)]
    with CaptureQueriesContext(connection) as queries:
        batch = claim_due(ClaimRequest(clock.now(), plan, total=100, budgets={channel.pk: (5, "email")}))
    lookups = [q["sql"] for q in queries if Suppression._meta.db_table in q["sql"]]
    assert len(lookups) == 1, lookups
    assert {o.record.recipient for o in batch.settled} == {"user3@example.com", "user40@example.com"}
    assert {o.error_kind for o in batch.settled} == {"suppressed"}
    assert len(batch.records) == len(rows) - 2
    # The settled rows kept their attempt count: none was used on them.
    assert {o.record.attempts for o in batch.settled} == {1}


@pytest.mark.django_db
def test_api_suppress_extends_one_row_and_is_audited():
    ChannelFactory(key="email")
    first = api.suppress("ann@example.com", channel="email")
    again = api.suppress("Ann@Example.com".replace("Ann", "ann"), channel="email", reason="complaint")
    assert first.pk == again.pk
    assert (again.events, again.reason, again.channel) == (2, "complaint", "email")
    assert api.is_suppressed("ann@EXAMPLE.COM", channel="email")
    assert not api.is_suppressed("ann@example.com", channel="sms")
    assert list(SuppressionChange.objects.values_list("action", "actor", "channel")) == [
        ("add", "api", "email"),
        ("add", "api", "email"),
    ]


@pytest.mark.django_db
def test_a_weaker_report_never_downgrades_a_complaint():
    api.suppress("ann@example.com", reason="complaint")
    row, created = service.record(
        "ann@example.com", reason="hard_bounce", source="Postmark", at=Suppression().first_event_at
    )
    assert (created, row.reason, row.events) == (False, "complaint", 2)


@pytest.mark.django_db
def test_unsuppress_star_lifts_every_channel_and_a_key_only_its_own_entry():
    ChannelFactory(key="email")
    ChannelFactory(key="sms")
    api.suppress("ann@example.com")
    api.suppress("ann@example.com", channel="email")
    api.suppress("ann@example.com", channel="sms")
    assert api.unsuppress("ann@example.com", channel="email") == 1
    assert api.is_suppressed("ann@example.com", channel="email")  # the '*' entry still holds
    assert api.unsuppress("Ann@EXAMPLE.com".replace("Ann", "ann")) == 2
    assert not api.is_suppressed("ann@example.com", channel="email")
    assert not Suppression.objects.exists()
    removes = SuppressionChange.objects.filter(action="remove")
    assert sorted(removes.values_list("channel", flat=True)) == ["*", "email", "sms"]


@pytest.mark.django_db
def test_bad_input_is_refused_with_a_clear_error_and_writes_nothing():
    with pytest.raises(ChannelConfig.DoesNotExist, match="no channel with key 'nope'"):
        api.suppress("ann@example.com", channel="nope")
    with pytest.raises(ValueError, match="reason must be one of"):
        api.suppress("ann@example.com", reason="because")
    with pytest.raises(ValueError, match="needs a recipient"):
        api.suppress("")
    assert not Suppression.objects.exists() and not SuppressionChange.objects.exists()


def test_normalization_is_one_pure_function():
    assert normalize_recipient("Ann <Ann@Example.COM>") == "ann@example.com"
    assert normalize_recipient(" John@EX.com ") == "john@ex.com"
    assert normalize_recipient("JOHN@Example.com") == normalize_recipient("john@example.COM")
    assert normalize_recipient("+1 555 0100") == "+1 555 0100"
    assert normalize_recipient("device-Token") == "device-Token"
