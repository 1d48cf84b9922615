"""The ``django_email`` provider against real servers on 127.0.0.1.

SMTP: aiosmtpd in this process (tests/support/smtp_server.py) answering each row of the failure
table. ESP: django-anymail's real Postmark backend, its API URL pointed at a local HTTP server.
Each outcome is checked where it matters, as the worker records it after a real tick.
"""

from __future__ import annotations

import random
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from notifications_retry.engine.worker import Worker
from notifications_retry.exceptions import PermanentProviderError, ProviderError, RetryableProviderError
from notifications_retry.models import NotificationEntity, Outbox
from notifications_retry.providers import email_errors, get_provider_class
from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
from notifications_retry.providers.django_email import DjangoEmailProvider
from notifications_retry.providers.email_errors import enhanced_status
from notifications_retry.providers.email_message import message_id
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.mailers import USES_MAILERS, MailerOptions, mailer_options_for
from tests.support.processes import free_port
from tests.support.smtp_server import REPLIES, GreetingRefusal, ScriptedSMTPServer

Status = NotificationEntity.Status
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
POSTMARK_BACKEND = "anymail.backends.postmark.EmailBackend"
#: The channel timeout of the tests where the server hangs: long enough that a loaded machine does not
#: time out a step before the hang, short enough to keep the suite fast.
HANG_TIMEOUT = 1.5
PAYLOAD = {"subject": "Your order", "body": "It shipped.", "from": "shop@example.com"}


@pytest.fixture
def smtp_server() -> Iterator[ScriptedSMTPServer]:
    server = ScriptedSMTPServer().start()
    yield server
    server.stop()


@pytest.fixture
def mailer_options(settings) -> MailerOptions:
    """Options of a channel sending through a backend, for the running Django version."""
    return mailer_options_for(settings)


@pytest.fixture
def smtp_options(smtp_server: ScriptedSMTPServer, mailer_options: MailerOptions) -> MailerOptions:
    """``make(**extra)``: options of a channel sending to the scripted SMTP server."""
    return lambda **extra: mailer_options(SMTP_BACKEND, smtp_server.backend_options(), **extra)


def provider(options: dict[str, object], timeout: float = 2.0) -> DjangoEmailProvider:
    return DjangoEmailProvider(ChannelSettings("email", "django_email", timeout, 2, options))


def outgoing(recipient: str = "ann@example.com", payload: object = None) -> OutgoingMessage:
    return OutgoingMessage(
        notification_id=uuid.uuid4(),
        tenant_id=None,
        channel="email",
        recipient=recipient,
        payload=dict(PAYLOAD) if payload is None else payload,
        attempt=1,
        priority=5,
        notification_type="transactional",
    )


def tick_one(clock, options: dict[str, object], recipient: str, timeout: float = 2.0, **fields):
    """One due notification on an email channel, one real worker tick; the row as it ends."""
    channel = ChannelFactory(
        key="email", provider_key="django_email", options=options, max_attempts=3, timeout_seconds=timeout
    )
    row = NotificationFactory(
        channel=channel,
        recipient=recipient,
        payload=fields.pop("payload", dict(PAYLOAD)),
        status=Status.FAILED,
        attempts=0,
        next_attempt_at=clock.now() - timedelta(seconds=1),
        **fields,
    )
    Worker(clock=clock, rng=random.Random(1)).run(once=True)
    row.refresh_from_db()
    return row


def assert_retry(row, clock, kind: str) -> None:
    assert row.status == Status.FAILED and row.dead_lettered_at is None, row.last_error
    assert (row.attempts, row.error_kind) == (1, kind), row.last_error
    assert row.next_attempt_at > clock.now()
    assert not Outbox.objects.exists()  # an intermediate failure emits nothing


def assert_terminal(row, kind: str) -> None:
    assert row.status == Status.FAILED and row.dead_lettered_at is not None, row.last_error
    assert row.error_kind == kind, row.last_error
    (event,) = Outbox.objects.all()
    assert event.payload["status"] == "Failed" and event.payload["error_kind"] == kind


# --- SMTP: the worker's outcomes ----------------------------------------------------------------------


@pytest.mark.django_db
def test_accepted_mail_is_sent_with_its_stable_message_id(clock, smtp_server, smtp_options):
    row = tick_one(clock, smtp_options(message_id_domain="mail.example.com"), "ann@example.com")
    assert row.status == Status.SENT, row.last_error
    expected = message_id(row.id, "mail.example.com")
    assert row.provider_message_id == expected
    (mail,) = smtp_server.messages
    assert mail["Message-ID"].strip() == expected  # a long header may be folded
    assert mail["X-Notification-Id"] == str(row.id)
    assert (mail["Subject"], mail["From"], mail["To"]) == (
        "Your order",
        "shop@example.com",
        "ann@example.com",
    )
    assert mail.get_content().strip() == "It shipped."
    (event,) = Outbox.objects.all()
    assert event.payload["status"] == "Sent" and event.payload["provider_message_id"] == expected


@pytest.mark.django_db
@pytest.mark.parametrize("code", [421, 450, 451, 452])
def test_smtp_4xx_to_the_recipient_is_retried(clock, code, smtp_options):
    row = tick_one(clock, smtp_options(), f"r{code}@example.com")
    assert_retry(row, clock, "smtp_4xx")
    assert f"SMTP {code} at RCPT TO" in row.last_error


@pytest.mark.django_db
@pytest.mark.parametrize("code", [550, 551, 552, 553, 554])
def test_smtp_5xx_to_the_recipient_is_terminal_with_the_enhanced_status(clock, code, smtp_options):
    row = tick_one(clock, smtp_options(), f"r{code}@example.com")
    # 550 5.1.1 names the mailbox as gone: its own kind, which suppresses the address (test_suppression_smtp).
    assert_terminal(row, "mailbox_unavailable" if code == 550 else "smtp_5xx")
    # "SMTP 550 at RCPT TO: 5.1.1 No such user here": the enhanced status code is kept.
    reply = row.last_error.split(": ", 1)[1]
    assert enhanced_status(reply) == REPLIES[code].split()[1]
    assert row.attempts == 1


@pytest.mark.django_db
def test_smtp_554_to_the_data_is_terminal(clock, smtp_options):
    row = tick_one(clock, smtp_options(), "data554@example.com")
    assert_terminal(row, "smtp_5xx")
    assert "SMTP 554 at DATA: 5.7.1" in row.last_error


@pytest.mark.django_db
def test_a_server_that_hangs_after_the_data_is_a_retried_timeout(clock, smtp_server, smtp_options):
    row = tick_one(clock, smtp_options(), "hang@example.com", timeout=HANG_TIMEOUT)
    assert smtp_server.data_received.is_set()
    assert_retry(row, clock, "timeout")


@pytest.mark.django_db
def test_a_connection_dropped_after_the_data_is_retried(clock, smtp_options):
    row = tick_one(clock, smtp_options(), "drop@example.com")
    assert_retry(row, clock, "connection")


@pytest.mark.django_db
def test_connection_refused_is_retried(clock, mailer_options):
    options = mailer_options(SMTP_BACKEND, {"host": "127.0.0.1", "port": free_port()})
    row = tick_one(clock, options, "ann@example.com")
    assert_retry(row, clock, "connection")


@pytest.mark.django_db
def test_an_invalid_payload_is_terminal_without_a_connection(clock, smtp_server, smtp_options):
    row = tick_one(clock, smtp_options(), "ann@example.com", payload={"subject": "no body"})
    assert_terminal(row, "invalid_payload")
    assert "'body' or 'html' is required" in row.last_error
    assert not smtp_server.data_received.is_set()


# --- SMTP: the error table, row by row, with its ambiguity ----------------------------------------------


@pytest.mark.parametrize(
    ("recipient", "sender", "error", "kind", "ambiguous"),
    [
        ("r421@example.com", None, RetryableProviderError, "smtp_4xx", False),
        ("r452@example.com", None, RetryableProviderError, "smtp_4xx", False),
        ("r550@example.com", None, PermanentProviderError, "mailbox_unavailable", False),
        ("r553@example.com", None, PermanentProviderError, "smtp_5xx", False),
        ("ann@example.com", "mail451@example.com", RetryableProviderError, "smtp_4xx", False),
        ("data554@example.com", None, PermanentProviderError, "smtp_5xx", False),
        ("drop@example.com", None, RetryableProviderError, "connection", True),
        ("hang@example.com", None, RetryableProviderError, "timeout", True),
    ],
)
def test_smtp_failures_classify_with_their_ambiguity(recipient, sender, error, kind, ambiguous, smtp_options):
    payload = {**PAYLOAD, "from": sender} if sender else None
    with pytest.raises(ProviderError) as info:
        # Only the hang waits out the timeout: a short one for it, a long one that a loaded machine
        # cannot hit for the others (every step of the conversation has that timeout).
        timeout = HANG_TIMEOUT if recipient.startswith("hang@") else 10.0
        provider(smtp_options(), timeout=timeout).send(outgoing(recipient, payload))
    assert type(info.value) is error
    assert (info.value.kind, info.value.ambiguous) == (kind, ambiguous)
    assert info.value.__cause__ is not None  # the backend's own error is kept


def test_a_421_greeting_is_retriable_and_unambiguous(mailer_options):
    server = GreetingRefusal().start()
    try:
        options = mailer_options(SMTP_BACKEND, {"host": "127.0.0.1", "port": server.port})
        with pytest.raises(RetryableProviderError) as info:
            provider(options).send(outgoing())
    finally:
        server.stop()
    assert (info.value.kind, info.value.ambiguous) == ("smtp_4xx", False)
    assert "SMTP 421 at connect: 4.3.2" in str(info.value)


def test_connection_refused_is_unambiguous(mailer_options):
    options = mailer_options(SMTP_BACKEND, {"host": "127.0.0.1", "port": free_port()})
    with pytest.raises(RetryableProviderError) as info:
        provider(options).send(outgoing())
    assert (info.value.kind, info.value.ambiguous) == ("connection", False)


def test_a_name_that_does_not_resolve_is_unambiguous():
    # A real lookup would leave the machine (tests talk to loopback only): the resolver's error itself.
    error = email_errors.classify(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "connect")
    assert (type(error), error.kind, error.ambiguous) == (RetryableProviderError, "dns", False)


def test_the_message_id_is_the_same_at_every_attempt(smtp_server, smtp_options):
    message = outgoing()
    email_provider = provider(smtp_options())
    first = email_provider.send(message)
    second = email_provider.send(message)
    assert first == second
    assert [m["Message-ID"].strip() for m in smtp_server.messages] == [first.provider_message_id] * 2
    assert first.provider_message_id == f"<notification.{message.notification_id}@example.com>"


def test_html_reply_to_and_headers_reach_the_server(smtp_server, smtp_options):
    payload = {
        **PAYLOAD,
        "html": "<p>It shipped.</p>",
        "reply_to": ["help@example.com"],
        "headers": {"X-Campaign": "orders"},
    }
    provider(smtp_options()).send(outgoing(payload=payload))
    (mail,) = smtp_server.messages
    assert mail["Reply-To"] == "help@example.com" and mail["X-Campaign"] == "orders"
    assert mail.get_body(("html",)).get_content().strip() == "<p>It shipped.</p>"
    assert mail.get_body(("plain",)).get_content().strip() == "It shipped."


@pytest.mark.parametrize(
    ("payload", "recipient", "fragment"),
    [
        ("just text", "ann@example.com", "must be a JSON object"),
        ({"body": "x"}, "ann@example.com", "'subject' is required"),
        ({"subject": " ", "body": "x"}, "ann@example.com", "'subject' must be a non-empty string"),
        ({"subject": "s", "body": 3}, "ann@example.com", "'body' must be a string"),
        ({"subject": "a\nBcc: x@evil.example", "body": "x"}, "ann@example.com", "one line"),
        ({"subject": "s", "body": "x", "colour": "red"}, "ann@example.com", "unknown payload key(s) colour"),
        ({"subject": "s", "body": "x", "html": 3}, "ann@example.com", "'html' must be a string"),
        ({"subject": "s", "body": "x"}, "not-an-address", "'recipient' is not an email address"),
        ({"subject": "s", "body": "x", "reply_to": 5}, "ann@example.com", "'reply_to' must be"),
        ({"subject": "s", "body": "x", "headers": {"Message-ID": "<x@y>"}}, "ann@example.com", "set by the"),
        ({"subject": "s", "body": "x", "headers": {"X-A": "1\r\nBcc: e"}}, "ann@example.com", "one line"),
    ],
)
def test_invalid_payloads_are_permanent_with_a_clear_message(
    smtp_server, payload, recipient, fragment, smtp_options
):
    with pytest.raises(PermanentProviderError) as info:
        provider(smtp_options()).send(outgoing(recipient, payload))
    assert info.value.kind == "invalid_payload" and not info.value.ambiguous
    assert fragment in str(info.value)
    assert not smtp_server.messages


def test_registry_and_options_validation():
    assert get_provider_class("django_email") is DjangoEmailProvider
    assert DjangoEmailProvider.options_problems({}) == []
    problems = DjangoEmailProvider.options_problems({"from_email": "", "colour": 1})
    assert any("options colour are unknown" in p for p in problems)
    assert any("'from_email' must be" in p for p in problems)


@pytest.mark.skipif(USES_MAILERS, reason="before Django 6.1 a channel names its backend class")
def test_before_django_6_1_the_backend_option_is_checked_and_mailer_is_refused_with_the_key_to_use():
    assert DjangoEmailProvider.options_problems({"backend": POSTMARK_BACKEND, "from_email": "a@b.c"}) == []
    problems = DjangoEmailProvider.options_problems({"backend": "no.such.Backend", "backend_options": []})
    assert any("cannot be imported" in p for p in problems)
    assert any("'backend_options' must be" in p for p in problems)
    assert DjangoEmailProvider.options_problems({"backend": "tests.factories.ChannelFactory"}) == [
        "django_email backend 'tests.factories.ChannelFactory' is not a Django email backend class"
    ]
    (problem,) = DjangoEmailProvider.options_problems({"mailer": "default"})
    assert "'mailer'" in problem and "needs Django 6.1 or later" in problem and "use 'backend'" in problem


@pytest.mark.skipif(not USES_MAILERS, reason="from Django 6.1 a channel names a MAILERS entry")
def test_from_django_6_1_the_mailer_option_is_checked_and_backend_is_refused_with_the_key_to_use(settings):
    settings.MAILERS = {
        "default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"},
        "esp": {"BACKEND": POSTMARK_BACKEND, "OPTIONS": {"server_token": "t"}},
        "odd": {"BACKEND": "tests.factories.ChannelFactory"},
    }
    assert DjangoEmailProvider.options_problems({"mailer": "esp", "from_email": "a@b.c"}) == []
    (unknown,) = DjangoEmailProvider.options_problems({"mailer": "nope"})
    assert "'nope', which is not in MAILERS (known: default, esp, odd)" in unknown
    (odd,) = DjangoEmailProvider.options_problems({"mailer": "odd"})
    assert "is not a Django email backend class" in odd
    assert "alias of a MAILERS entry" in DjangoEmailProvider.options_problems({"mailer": 5})[0]
    (legacy,) = DjangoEmailProvider.options_problems({"backend": SMTP_BACKEND, "backend_options": {}})
    assert "'backend' and 'backend_options' are for Django before 6.1" in legacy
    assert "name an entry of the MAILERS setting in 'mailer'" in legacy
    settings.MAILERS = {"esp": settings.MAILERS["esp"]}
    (no_default,) = DjangoEmailProvider.options_problems({})
    assert "a channel without 'mailer' uses 'default', which is not in MAILERS (known: esp)" in no_default


# --- off the event loop, within the channel's concurrency ----------------------------------------------


@pytest.mark.django_db
def test_a_hung_mail_server_holds_up_neither_another_channel_nor_more_than_max_concurrency(
    clock, smtp_server, webhook_server, smtp_options
):
    email = ChannelFactory(
        key="email",
        provider_key="django_email",
        options=smtp_options(),
        timeout_seconds=HANG_TIMEOUT,
        max_concurrency=2,
        max_attempts=3,
    )
    hook = ChannelFactory(key="hook", provider_key="webhook", options={"url": webhook_server.url})
    due = {"status": Status.FAILED, "attempts": 0, "next_attempt_at": clock.now() - timedelta(seconds=1)}
    hung = [
        NotificationFactory(channel=email, recipient="hang@example.com", payload=PAYLOAD, **due)
        for _ in range(4)
    ]
    other = NotificationFactory(channel=hook, **due)
    started = time.monotonic()
    Worker(clock=clock, rng=random.Random(1)).run(once=True)
    elapsed = time.monotonic() - started
    (request,) = webhook_server.requests
    # The webhook went out while the mail server sat on the first two emails' data.
    assert request.received_at - started < HANG_TIMEOUT - 0.1
    other.refresh_from_db()
    assert other.status == Status.SENT
    # Four timeouts, two at a time: about two timeouts long, never four (one at a time), never one.
    assert 2 * HANG_TIMEOUT - 0.1 < elapsed < 4 * HANG_TIMEOUT - 0.1
    assert smtp_server.max_hanging == 2
    for row in hung:
        row.refresh_from_db()
        assert (row.status, row.error_kind) == (Status.FAILED, "timeout")


def test_without_a_backend_option_the_projects_default_mailer_sends(settings):
    from django.core import mail

    if not USES_MAILERS:  # from 6.1 the test runner makes every MAILERS entry the memory backend
        settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "noreply@shop.example"
    message = outgoing(payload={"subject": "Hi", "body": "Hello"})
    result = provider({}).send(message)
    (sent,) = mail.outbox
    assert sent.from_email == "noreply@shop.example" and sent.to == ["ann@example.com"]
    assert sent.extra_headers["X-Notification-Id"] == str(message.notification_id)
    assert result.provider_message_id == message_id(message.notification_id, "shop.example")


def test_an_html_only_payload_sends_an_html_email_without_an_empty_text_part(smtp_server, smtp_options):
    provider(smtp_options()).send(outgoing(payload={"subject": "Hi", "html": "<p>It shipped.</p>"}))
    (mail,) = smtp_server.messages
    assert mail.get_content_type() == "text/html"
    assert mail.get_content().strip() == "<p>It shipped.</p>"


# --- evidence per attempt -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_smtp_refusal_keeps_its_reply_code_enhanced_status_and_server_address(clock, smtp_options):
    row = tick_one(clock, smtp_options(), "r550@example.com")
    (entry,) = row.attempt_log
    assert entry["status_code"] == 550 and entry["remote_addr"] == "127.0.0.1"
    assert enhanced_status(entry["response_excerpt"]) == REPLIES[550].split()[1]
    assert "r550@example.com" not in entry["response_excerpt"]


@pytest.mark.django_db
def test_an_accepted_mail_records_the_250(clock, smtp_options):
    row = tick_one(clock, smtp_options(), "ann@example.com")
    (entry,) = row.attempt_log
    assert (entry["status_code"], entry["remote_addr"], entry["response_excerpt"]) == (250, "127.0.0.1", "")


@pytest.mark.django_db
def test_a_refused_connection_has_no_reply(clock, mailer_options):
    port = free_port()
    options = mailer_options(SMTP_BACKEND, {"host": "127.0.0.1", "port": port})
    row = tick_one(clock, options, "ann@example.com")
    (entry,) = row.attempt_log
    assert (entry["status_code"], entry["remote_addr"]) == (None, None)
