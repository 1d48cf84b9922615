"""ESP tracking webhooks, signed as the ESPs sign them, through django-anymail's own views.

The requests go through the test client to ``anymail.urls`` (mounted at ``/anymail/``): anymail checks
the Postmark basic auth or the Mailgun HMAC signature, parses the ESP's JSON and sends its ``tracking``
signal, which the app's receiver reads. A forged request is turned away by anymail and changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import uuid
from datetime import timedelta

import jsonschema
import pytest
from structlog.testing import capture_logs

from notifications_retry import api
from notifications_retry.delivery import events
from notifications_retry.engine.worker import Worker
from notifications_retry.models import DeliveryStatus, NotificationEntity, Outbox, Suppression
from tests.factories import ChannelFactory, NotificationFactory
from tests.integration.test_django_email_anymail import postmark_ok, postmark_options

Status = NotificationEntity.Status
SECRET = "anymail-user:s3cret-pass"
MAILGUN_KEY = "key-0123456789abcdef"
STATUS_VALIDATOR = jsonschema.Draft202012Validator(
    events.delivery_status_schema(), format_checker=jsonschema.FormatChecker()
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _anymail(settings):
    settings.ANYMAIL = {"WEBHOOK_SECRET": SECRET, "MAILGUN_WEBHOOK_SIGNING_KEY": MAILGUN_KEY}


def sent(recipient="ann@example.com", message_id="pm-42", key="email"):
    channel = ChannelFactory(key=key, provider_key="django_email")
    return NotificationFactory(
        channel=channel, recipient=recipient, status=Status.SENT, attempts=1, provider_message_id=message_id
    )


def postmark(client, body, auth=SECRET):
    headers = {}
    if auth is not None:
        headers["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(auth.encode()).decode()
    return client.post(
        "/anymail/postmark/tracking/", data=json.dumps(body), content_type="application/json", **headers
    )


def bounce(row, kind="HardBounce", **extra):
    return {
        "RecordType": "Bounce",
        "Type": kind,
        "ID": 4242,
        "MessageID": row.provider_message_id,
        "Email": row.recipient,
        "BouncedAt": "2026-03-01T10:00:00Z",
        "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist",
        "Description": "The server was unable to deliver your message.",
        "Metadata": {"notification_id": str(row.pk)},
        **extra,
    }


def mailgun(client, event_data, key=MAILGUN_KEY):
    """A Mailgun webhook POST: its HMAC signature, and anymail's shared basic auth (both are checked)."""
    timestamp, token = "1772359200", uuid.uuid4().hex
    signature = hmac.new(key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()
    body = {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature},
        "event-data": event_data,
    }
    return client.post(
        "/anymail/mailgun/tracking/",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION="Basic " + base64.b64encode(SECRET.encode()).decode(),
    )


def status_events(row):
    return list(Outbox.objects.filter(key=str(row.pk), topic="pin.notifications.delivery-status.v1"))


def test_a_postmark_hard_bounce_suppresses_the_address_and_sets_bounced(client):
    row = sent()
    assert postmark(client, bounce(row)).status_code == 200
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.channel, suppression.reason) == (
        "ann@example.com",
        "*",
        "hard_bounce",
    )
    assert suppression.source == "Postmark" and "5.1.1" in suppression.detail
    status = DeliveryStatus.objects.get(notification=row)
    assert (status.state, status.esp, status.bounced_at.isoformat()) == (
        "bounced",
        "Postmark",
        "2026-03-01T10:00:00+00:00",
    )
    (event,) = status_events(row)
    assert (event.generation, event.payload["state"], event.payload["provider_message_id"]) == (
        3,
        "bounced",
        "pm-42",
    )
    STATUS_VALIDATOR.validate(events.envelope(event))
    assert api.is_suppressed("ann@example.com", channel="email")


@pytest.mark.parametrize("kind", ["SoftBounce", "Transient", "DnsError", "AutoResponder"])
def test_soft_bounces_and_deferrals_change_nothing(client, kind):
    row = sent()
    assert postmark(client, bounce(row, kind, Details="smtp;452 4.2.2 mailbox full")).status_code == 200
    assert not Suppression.objects.exists()
    assert not DeliveryStatus.objects.exists() and not status_events(row)


def test_delivered_then_opened_each_announced_once_and_the_state_moves_up(client):
    row = sent()
    delivery = {
        "RecordType": "Delivery",
        "MessageID": "pm-42",
        "Recipient": "ann@example.com",
        "DeliveredAt": "2026-03-01T10:00:00Z",
        "Metadata": {"notification_id": str(row.pk)},
    }
    opened = {**delivery, "RecordType": "Open", "ReceivedAt": "2026-03-01T11:00:00Z"}
    del opened["DeliveredAt"]
    for body in (delivery, delivery, opened, delivery):  # a webhook retried, a late duplicate
        assert postmark(client, body).status_code == 200
    status = DeliveryStatus.objects.get(notification=row)
    assert (status.state, status.state_at.hour, status.delivered_at.hour, status.opened_at.hour) == (
        "opened",
        11,
        10,
        11,
    )
    assert [(e.generation, e.payload["state"]) for e in status_events(row)] == [
        (1, "delivered"),
        (2, "opened"),
    ]
    for event in status_events(row):
        STATUS_VALIDATOR.validate(events.envelope(event))
    assert not Suppression.objects.exists()
    # The dispatched topic is untouched: the Sent row's own event is the only one it will ever have.
    assert not Outbox.objects.filter(topic="pin.notifications.dispatched.v1").exists()


def test_a_complaint_suppresses_on_every_channel_and_an_unsubscribe_on_its_own(client):
    complained = sent("ann@example.com", "pm-1")
    unsubscribed = sent("bob@example.com", "pm-2", key="email")
    spam = {
        "RecordType": "SpamComplaint",
        "Type": "SpamComplaint",
        "MessageID": "pm-1",
        "Email": "ann@example.com",
        "BouncedAt": "2026-03-01T10:00:00Z",
        "Metadata": {"notification_id": str(complained.pk)},
    }
    unsubscribe = {
        "RecordType": "SubscriptionChange",
        "MessageID": "pm-2",
        "Recipient": "bob@example.com",
        "SuppressSending": True,
        "SuppressionReason": "ManualSuppression",
        "ChangedAt": "2026-03-01T10:00:00Z",
        "Metadata": {"notification_id": str(unsubscribed.pk)},
    }
    assert postmark(client, spam).status_code == 200
    assert postmark(client, unsubscribe).status_code == 200
    assert set(Suppression.objects.values_list("address", "channel", "reason")) == {
        ("ann@example.com", "*", "complaint"),
        ("bob@example.com", "email", "unsubscribed"),
    }
    assert DeliveryStatus.objects.get(notification=complained).state == "complained"
    assert not DeliveryStatus.objects.filter(notification=unsubscribed).exists()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("BadEmailAddress", "invalid_recipient"), ("ManuallyDeactivated", None), ("Blocked", None)],
)
def test_a_reject_suppresses_only_when_its_reason_is_permanent(client, kind, reason):
    row = sent()
    assert postmark(client, bounce(row, kind)).status_code == 200
    assert list(Suppression.objects.values_list("reason", flat=True)) == ([reason] if reason else [])


def test_events_for_addresses_the_app_never_sent_to_are_logged_and_change_nothing(client):
    row = sent()
    strangers = [
        bounce(row, MessageID="pm-someone-else"),  # another message
        bounce(row, Email="carol@example.com"),  # another recipient
        bounce(row, Metadata={"notification_id": str(uuid.uuid4())}),  # no such notification
        bounce(row, Metadata={}),  # no notification named at all
    ]
    with capture_logs() as logs:
        for body in strangers:
            assert postmark(client, body).status_code == 200
    assert not Suppression.objects.exists() and not DeliveryStatus.objects.exists()
    unmatched = [entry for entry in logs if entry["event"] == "esp-report-unmatched"]
    assert len(unmatched) == 4
    assert all(
        entry["esp"] == "Postmark" and "example.com" not in entry["recipient"][:3] for entry in unmatched
    )


@pytest.mark.parametrize("auth", [None, "anymail-user:wrong", "someone:s3cret-pass"])
def test_a_forged_postmark_post_changes_nothing(client, auth):
    row = sent()
    response = postmark(client, bounce(row), auth=auth)
    assert response.status_code in (400, 401, 403)
    assert not Suppression.objects.exists() and not DeliveryStatus.objects.exists()
    assert not Outbox.objects.exists()


def mailgun_failure(row, severity):
    return {
        "event": "failed",
        "severity": severity,
        "timestamp": 1772359200.0,
        "recipient": row.recipient,
        "message": {"headers": {"message-id": row.provider_message_id.strip("<>")}},
        "user-variables": {"notification_id": str(row.pk)},
        "delivery-status": {"code": 550, "message": "5.1.1 No such user", "description": ""},
        "reason": "bounce",
    }


def test_a_mailgun_permanent_failure_signed_with_the_key_suppresses(client):
    row = sent(message_id="<20260301.1@mg.example.com>")
    assert mailgun(client, mailgun_failure(row, "permanent")).status_code == 200
    assert Suppression.objects.get().reason == "hard_bounce"
    assert DeliveryStatus.objects.get(notification=row).state == "bounced"


def test_a_mailgun_temporary_failure_changes_nothing(client):
    row = sent(message_id="<20260301.1@mg.example.com>")
    assert mailgun(client, mailgun_failure(row, "temporary")).status_code == 200
    assert not Suppression.objects.exists() and not DeliveryStatus.objects.exists()


def test_a_mailgun_post_with_a_forged_signature_changes_nothing(client):
    row = sent(message_id="<20260301.1@mg.example.com>")
    response = mailgun(client, mailgun_failure(row, "permanent"), key="key-not-the-real-one")
    assert response.status_code in (400, 401, 403)
    assert not Suppression.objects.exists() and not DeliveryStatus.objects.exists()


def postmark_channel_tick(clock, webhook_server, settings):
    """A ``tick(recipient)`` that sends one due email through anymail's Postmark backend (its API on
    127.0.0.1) in one worker tick and returns the row."""
    webhook_server.responder = postmark_ok
    channel = ChannelFactory(
        key="email", provider_key="django_email", options=postmark_options(webhook_server, settings)
    )

    def tick(recipient):
        row = NotificationFactory(
            channel=channel,
            recipient=recipient,
            payload={"subject": "Your order", "body": "It shipped.", "from": "shop@example.com"},
            status=Status.FAILED,
            attempts=0,
            next_attempt_at=clock.now() - timedelta(seconds=1),
        )
        worker = Worker(clock=clock, rng=random.Random(1))
        try:
            worker.run(once=True)
        finally:
            worker.close()
        row.refresh_from_db()
        return row

    return tick


def test_a_bounce_reported_for_a_real_postmark_send_stops_the_next_send_to_that_address(
    client, clock, webhook_server, settings
):
    """End to end: anymail's Postmark backend sends (its API on 127.0.0.1), Postmark's bounce webhook
    comes back with the metadata it was given, and the next notification to the address never reaches
    the ESP."""
    tick = postmark_channel_tick(clock, webhook_server, settings)
    first = tick("ann@example.com")
    assert (first.status, first.provider_message_id) == (Status.SENT, "pm-42")
    (request,) = webhook_server.requests
    metadata = request.json()["Metadata"]
    assert metadata == {"notification_id": str(first.pk)}
    # Postmark reports the hard bounce, echoing the message's metadata, as it does.
    assert postmark(client, {**bounce(first), "Metadata": metadata}).status_code == 200
    second = tick("ann@example.com")
    assert (second.status, second.error_kind, second.attempts) == (Status.FAILED, "suppressed", 0)
    assert len(webhook_server.requests) == 1  # the ESP never heard of the second one


def test_the_case_different_bounce_matches_suppresses_and_stops_the_next_send(
    client, clock, webhook_server, settings
):
    """A message sent to ``John@Example.com`` bounces as ``john@example.com`` (ESPs report addresses
    without case): the report matches, the address is suppressed, and the next notification to the
    mailbox, however it is cased, never reaches the ESP. The address is sent as written."""
    tick = postmark_channel_tick(clock, webhook_server, settings)
    first = tick("John@Example.com")
    assert first.status == Status.SENT, first.last_error
    (request,) = webhook_server.requests
    assert request.json()["To"] == "John@Example.com"  # sent as written
    with capture_logs() as logs:
        response = postmark(
            client, {**bounce(first), "Email": "john@example.com", "Metadata": request.json()["Metadata"]}
        )
    assert response.status_code == 200
    assert [e["event"] for e in logs if e["event"].startswith("esp-report")] == ["esp-report-applied"]
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.channel, suppression.reason) == (
        "john@example.com",
        "*",
        "hard_bounce",
    )
    assert DeliveryStatus.objects.get(notification=first).state == "bounced"
    for recipient in ("John@Example.com", "JOHN@EXAMPLE.COM", "John <john@example.com>"):
        later = tick(recipient)
        assert (later.status, later.error_kind, later.attempts) == (Status.FAILED, "suppressed", 0)
        assert later.recipient == recipient
    assert len(webhook_server.requests) == 1  # the ESP heard of the first one only
