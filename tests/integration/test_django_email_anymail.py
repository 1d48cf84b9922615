"""The ``django_email`` provider through django-anymail's real Postmark backend, its API on 127.0.0.1.

The backend is anymail's own, unchanged: only its ``api_url`` points at a local HTTP server
(tests/support/http_server.py) that answers as Postmark does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from notifications_retry.exceptions import PermanentProviderError, RetryableProviderError
from notifications_retry.models import NotificationEntity
from notifications_retry.providers.django_email import DjangoEmailProvider
from notifications_retry.providers.email_message import message_id
from tests.integration.test_django_email_provider import (
    assert_retry,
    assert_terminal,
    outgoing,
    provider,
    tick_one,
)
from tests.support.http_server import RecordedRequest, Reply, ScriptedServer
from tests.support.mailers import CountingBackend, MailerOptions, mailer_options_for
from tests.support.processes import free_port

Status = NotificationEntity.Status
POSTMARK_BACKEND = "anymail.backends.postmark.EmailBackend"


@pytest.fixture
def mailer_options(settings) -> MailerOptions:
    """Options of a channel sending through a backend, for the running Django version."""
    return mailer_options_for(settings)


def postmark_options(server: ScriptedServer, settings: Any) -> dict[str, object]:
    """A channel on anymail's Postmark backend, its API ``server`` (``settings``: pytest-django's)."""
    api_url = server.url.rsplit("/", 1)[0] + "/"
    return mailer_options_for(settings)(POSTMARK_BACKEND, {"server_token": "test-token", "api_url": api_url})


def postmark_ok(request: RecordedRequest) -> Reply:
    to = request.json()["To"]
    return Reply(
        200,
        {
            "To": to,
            "SubmittedAt": "2026-01-01T00:00:00Z",
            "MessageID": "pm-42",
            "ErrorCode": 0,
            "Message": "OK",
        },
    )


@pytest.mark.django_db
def test_postmark_200_is_sent_with_the_esp_message_id(clock, webhook_server, settings):
    webhook_server.responder = postmark_ok
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    assert row.status == Status.SENT, row.last_error
    assert row.provider_message_id == "pm-42"
    (request,) = webhook_server.requests
    assert request.path.endswith("/email")
    assert request.headers["x-postmark-server-token"] == "test-token"
    sent = request.json()
    headers = {h["Name"]: h["Value"] for h in sent["Headers"]}
    assert headers["X-Notification-Id"] == str(row.id)
    assert headers["Message-ID"] == message_id(row.id, "example.com")
    assert (sent["Subject"], sent["TextBody"], sent["To"]) == ("Your order", "It shipped.", "ann@example.com")


@pytest.mark.django_db
def test_postmark_422_inactive_recipient_is_terminal_recipients_refused(clock, webhook_server, settings):
    webhook_server.responder = lambda r: Reply(
        422,
        {
            "ErrorCode": 406,
            "Message": "You tried to send to a recipient that has been marked as inactive.\n"
            "Found inactive addresses: ann@example.com.\nInactive recipients are ones that have "
            "generated a hard bounce or a spam complaint.",
        },
    )
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    assert_terminal(row, "recipients_refused")


@pytest.mark.django_db
def test_postmark_422_invalid_request_is_terminal_http_4xx(clock, webhook_server, settings):
    webhook_server.responder = lambda r: Reply(
        422, {"ErrorCode": 300, "Message": "Invalid 'From' address: 'shop@example.com'."}
    )
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    assert_terminal(row, "http_4xx")
    assert "422" in row.last_error


@pytest.mark.django_db
def test_postmark_429_is_retried_no_sooner_than_retry_after(clock, webhook_server, settings):
    webhook_server.responder = lambda r: Reply(
        429, {"ErrorCode": 429, "Message": "Rate limit"}, headers={"Retry-After": "900"}
    )
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    assert_retry(row, clock, "throttled")
    assert row.next_attempt_at >= clock.now() + timedelta(seconds=900)


@pytest.mark.django_db
def test_postmark_500_is_retried(clock, webhook_server, settings):
    webhook_server.responder = lambda r: Reply(500, {"ErrorCode": 500, "Message": "Internal error"})
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    assert_retry(row, clock, "http_5xx")


def test_postmark_errors_say_whether_they_are_ambiguous(webhook_server, mailer_options, settings):
    for status, error, ambiguous in (
        (429, RetryableProviderError, False),
        (500, RetryableProviderError, True),
        (503, RetryableProviderError, False),
        # The webhook's table: a 4xx answer may come after the other side acted.
        (400, PermanentProviderError, True),
    ):
        webhook_server.responder = lambda r, s=status: Reply(s, {"ErrorCode": s, "Message": "x"})
        with pytest.raises(error) as info:
            provider(postmark_options(webhook_server, settings)).send(outgoing())
        assert info.value.ambiguous is ambiguous, status
    options = mailer_options(
        POSTMARK_BACKEND, {"server_token": "t", "api_url": f"http://127.0.0.1:{free_port()}/"}
    )
    with pytest.raises(RetryableProviderError) as refused:
        provider(options).send(outgoing())
    assert (refused.value.kind, refused.value.ambiguous) == ("connection", False)


@pytest.mark.django_db
def test_esp_answers_fill_the_attempt_evidence(clock, webhook_server, settings):
    webhook_server.responder = lambda r: Reply(
        422, {"ErrorCode": 300, "Message": "Invalid 'To' address: 'ann@example.com'."}
    )
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    (entry,) = row.attempt_log
    assert entry["status_code"] == 422 and entry["trigger"] == "scheduled"
    assert "Invalid 'To' address" in entry["response_excerpt"]
    assert "ann@example.com" not in entry["response_excerpt"]


@pytest.mark.django_db
def test_an_esp_delivery_keeps_its_http_status(clock, webhook_server, settings):
    webhook_server.responder = postmark_ok
    row = tick_one(clock, postmark_options(webhook_server, settings), "ann@example.com")
    (entry,) = row.attempt_log
    assert (entry["status_code"], entry["response_excerpt"]) == (200, "")


def test_a_postmark_backend_without_its_server_token_is_warned_about_with_anymail_s_words(
    settings, mailer_options
):
    settings.ANYMAIL = {}
    options = mailer_options(POSTMARK_BACKEND)
    (warning,) = DjangoEmailProvider.options_warnings(options)
    assert "is not configured" in warning and "server_token" in warning.lower()  # anymail names it
    assert DjangoEmailProvider.options_problems(options) == []  # valid options: the channel is not set aside
    assert DjangoEmailProvider.options_warnings(mailer_options(POSTMARK_BACKEND, {"server_token": "t"})) == []
    settings.ANYMAIL = {"POSTMARK_SERVER_TOKEN": "t"}
    assert DjangoEmailProvider.options_warnings(options) == []
    # Only anymail backends are built to be checked: another may connect or write files when built.
    built = CountingBackend.built
    assert DjangoEmailProvider.options_warnings(mailer_options("tests.support.mailers.CountingBackend")) == []
    assert CountingBackend.built == built
