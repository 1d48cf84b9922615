"""A permanent SMTP reply naming the recipient suppresses it; the next notification to it opens no connection.

aiosmtpd on 127.0.0.1 (tests/support/smtp_server.py) answers ``550 5.1.1`` to RCPT TO for ``r550@…``
and counts the connections it accepts; the worker's real ticks send through Django's SMTP backend.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta

import pytest

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox, Suppression
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.mailers import mailer_options_for
from tests.support.smtp_server import ScriptedSMTPServer

Status = NotificationEntity.Status
PAYLOAD = {"subject": "Your order", "body": "It shipped.", "from": "shop@example.com"}

pytestmark = pytest.mark.django_db


@pytest.fixture
def smtp_server() -> Iterator[ScriptedSMTPServer]:
    server = ScriptedSMTPServer().start()
    yield server
    server.stop()


@pytest.fixture
def email_channel(settings):
    """``make(server)``: an email channel sending through Django's SMTP backend to ``server``."""

    def make(server):
        options = mailer_options_for(settings)(
            "django.core.mail.backends.smtp.EmailBackend", server.backend_options()
        )
        return ChannelFactory(key="email", provider_key="django_email", options=options, max_attempts=3)

    return make


def send(clock, channel, recipient):
    row = NotificationFactory(
        channel=channel,
        recipient=recipient,
        payload=dict(PAYLOAD),
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


def test_a_550_5_1_1_suppresses_and_the_second_notification_opens_no_smtp_connection(
    clock, smtp_server, email_channel
):
    channel = email_channel(smtp_server)
    started = smtp_server.connections  # aiosmtpd's controller connects once itself when it starts
    first = send(clock, channel, "r550@example.com")
    assert (first.status, first.error_kind, first.attempts) == (Status.FAILED, "mailbox_unavailable", 1)
    assert first.dead_lettered_at is not None and "5.1.1" in first.last_error
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.channel, suppression.reason) == (
        "r550@example.com",
        "*",
        "invalid_recipient",
    )
    assert suppression.source == "SMTP 550 5.1.1" and "No such user" in suppression.detail
    connections = smtp_server.connections
    assert connections == started + 1
    second = send(clock, channel, "r550@EXAMPLE.com")
    assert (second.status, second.error_kind, second.attempts) == (Status.FAILED, "suppressed", 0)
    assert smtp_server.connections == connections  # no connection at all for it
    (event,) = Outbox.objects.filter(key=str(second.pk))
    assert (event.payload["status"], event.payload["error_kind"], event.payload["attempts"]) == (
        "Failed",
        "suppressed",
        0,
    )
    # Another address still goes out on the same channel.
    assert send(clock, channel, "ann@example.com").status == Status.SENT
    assert smtp_server.connections == connections + 1


@pytest.mark.parametrize("recipient", ["r451@example.com", "r450@example.com", "r452@example.com"])
def test_a_4xx_reply_never_suppresses(clock, smtp_server, recipient, email_channel):
    row = send(clock, email_channel(smtp_server), recipient)
    assert row.status == Status.FAILED and row.dead_lettered_at is None  # retried later
    assert not Suppression.objects.exists()


@pytest.mark.parametrize(
    "recipient", ["r552@example.com", "r553@example.com", "r554@example.com", "data554@example.com"]
)
def test_a_5xx_that_does_not_name_the_mailbox_as_gone_is_terminal_without_suppressing(
    clock, smtp_server, recipient, email_channel
):
    row = send(clock, email_channel(smtp_server), recipient)
    assert (row.status, row.error_kind) == (Status.FAILED, "smtp_5xx")
    assert not Suppression.objects.exists()
