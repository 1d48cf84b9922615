"""The webhook provider against a real HTTP server on 127.0.0.1 (SPEC §5's contract)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from notifications_retry.exceptions import PermanentProviderError, ProviderThrottled, RetryableProviderError
from notifications_retry.providers import get_provider_class
from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
from notifications_retry.providers.http_status import parse_retry_after
from notifications_retry.providers.webhook import WebhookProvider, classify_response
from tests.conftest import allow_loopback
from tests.support.http_server import Reply, ScriptedServer


def provider_for(server: ScriptedServer, timeout: float = 2.0, **options) -> WebhookProvider:
    return WebhookProvider(ChannelSettings("webhook", "webhook", timeout, 4, {"url": server.url, **options}))


def message(**overrides) -> OutgoingMessage:
    values = dict(
        notification_id=uuid.uuid4(),
        tenant_id=None,
        channel="webhook",
        recipient="+33600000000",
        payload={"text": "hi", "n": 1},
        attempt=1,
        priority=5,
        notification_type="transactional",
    )
    values.update(overrides)
    return OutgoingMessage(**values)


def test_registry_resolves_webhook():
    assert get_provider_class("webhook") is WebhookProvider


def test_success_posts_json_with_idempotency_key_and_takes_the_id(webhook_server):
    webhook_server.responder = lambda r: Reply(201, {"id": "prov-42"})
    msg = message()
    result = provider_for(webhook_server).send(msg)
    assert result.provider_message_id == "prov-42"
    (request,) = webhook_server.requests
    assert request.headers["idempotency-key"] == str(msg.notification_id)
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["notification_id"] == str(msg.notification_id)
    assert body["channel"] == "webhook"
    assert body["recipient"] == "+33600000000"
    assert body["payload"] == {"text": "hi", "n": 1}


def test_body_is_byte_identical_across_attempts(webhook_server):
    msg = message()
    provider = provider_for(webhook_server)
    provider.send(msg)
    provider.send(OutgoingMessage(**{**msg.__dict__, "attempt": 2}))
    first, second = webhook_server.requests
    assert first.body == second.body


@pytest.mark.parametrize("body", [b"", b"not json", b"[1,2]", b'{"other": 1}'])
def test_success_without_usable_id_is_still_sent(webhook_server, body):
    webhook_server.responder = lambda r: Reply(200, body)
    assert provider_for(webhook_server).send(message()).provider_message_id is None


@pytest.mark.parametrize("status", [500, 502, 504, 599])
def test_5xx_is_retriable(webhook_server, status):
    webhook_server.responder = lambda r: Reply(status, "oops")
    with pytest.raises(RetryableProviderError) as info:
        provider_for(webhook_server).send(message())
    assert info.value.kind == "http_5xx"


def test_408_is_retriable(webhook_server):
    webhook_server.responder = lambda r: Reply(408)
    with pytest.raises(RetryableProviderError) as info:
        provider_for(webhook_server).send(message())
    assert info.value.retriable


def test_429_is_throttling_with_retry_after_seconds(webhook_server):
    webhook_server.responder = lambda r: Reply(429, headers={"Retry-After": "17"})
    with pytest.raises(ProviderThrottled) as info:
        provider_for(webhook_server).send(message())
    assert info.value.retry_after == 17
    assert info.value.kind == "throttled"


def test_503_honours_retry_after_http_date(webhook_server):
    when = datetime.now(UTC) + timedelta(seconds=120)
    webhook_server.responder = lambda r: Reply(
        503, headers={"Retry-After": format_datetime(when, usegmt=True)}
    )
    with pytest.raises(RetryableProviderError) as info:
        provider_for(webhook_server).send(message())
    assert 100 < info.value.retry_after <= 121


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_other_4xx_is_permanent_and_ambiguous(webhook_server, status):
    webhook_server.responder = lambda r: Reply(status)
    with pytest.raises(PermanentProviderError) as info:
        provider_for(webhook_server).send(message())
    # The receiver may have acted before refusing (a 409: the same Idempotency-Key is in progress).
    assert not info.value.retriable and info.value.ambiguous


def test_redirect_is_not_followed_and_is_permanent(webhook_server):
    webhook_server.responder = lambda r: Reply(302, headers={"Location": "http://127.0.0.1:9/elsewhere"})
    with pytest.raises(PermanentProviderError):
        provider_for(webhook_server).send(message())
    assert len(webhook_server.requests) == 1


def test_slow_answer_times_out_as_retriable(webhook_server):
    webhook_server.responder = lambda r: Reply(200, delay=2)
    started = time.monotonic()
    with pytest.raises(RetryableProviderError) as info:
        provider_for(webhook_server, timeout=0.3).send(message())
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 1.5


def test_connection_refused_is_retriable(settings):
    allow_loopback(settings)
    server = ScriptedServer().start()
    url = server.url
    server.stop()
    provider = WebhookProvider(ChannelSettings("webhook", "webhook", 1.0, 1, {"url": url}))
    with pytest.raises(RetryableProviderError) as info:
        provider.send(message())
    assert info.value.kind == "connection"


def test_secret_signs_the_body(webhook_server):
    import hashlib
    import hmac

    provider_for(webhook_server, secret="s3cret").send(message())
    (request,) = webhook_server.requests
    expected = hmac.new(b"s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-signature"] == f"sha256={expected}"


def test_unserializable_payload_is_permanent_without_a_request(webhook_server):
    with pytest.raises(PermanentProviderError) as info:
        provider_for(webhook_server).send(message(payload={"when": object()}))
    assert info.value.kind == "serialization"
    assert webhook_server.requests == []


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({}, "needs options['url']"),
        ({"url": "ftp://x"}, "http(s) URL"),
        ({"url": 5}, "needs options['url']"),
        ({"url": "http://h", "headers": {"a": 1}}, "headers"),
        ("nope", "JSON object"),
    ],
)
def test_bad_options_are_described(options, fragment):
    problems = WebhookProvider.options_problems(options)
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize(("value", "expected"), [("5", 5.0), (None, None), ("", None), ("soon", None)])
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


def test_503_retry_after_in_year_9999_waits_the_documented_maximum(webhook_server):
    webhook_server.responder = lambda r: Reply(503, headers={"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"})
    with pytest.raises(RetryableProviderError) as info:
        provider_for(webhook_server).send(message())
    assert info.value.retry_after == 3600


def test_429_retry_after_clamped_to_the_setting(webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {**settings.NOTIFICATIONS_RETRY, "RETRY_AFTER_MAX_SECONDS": 90}
    webhook_server.responder = lambda r: Reply(429, headers={"Retry-After": "999999999999"})
    with pytest.raises(ProviderThrottled) as info:
        provider_for(webhook_server).send(message())
    assert info.value.retry_after == 90


@pytest.mark.parametrize(
    ("answer", "message_id"),
    [
        (b'{"id":"a1"}', "a1"),
        (b'{"id":12}', "12"),
        # Past 64 bits orjson would read a float: the standard library keeps the receiver's digits.
        (b'{"id":123456789012345678901234567890}', "123456789012345678901234567890"),
        (b'{"id":1.5}', "1.5"),
        # orjson refuses NaN and a byte order mark; the standard library reads both.
        (b'{"id":NaN}', "nan"),
        (b'\xef\xbb\xbf{"id":"bom"}', "bom"),
        (b'{"id":null}', None),
        (b'["a1"]', None),
        (b"not json", None),
        (b"", None),
        (b'{"id":"' + b"x" * 300 + b'"}', "x" * 255),
    ],
)
def test_a_success_answer_gives_its_id_as_the_receiver_wrote_it(answer, message_id):
    assert classify_response(200, {}, answer).provider_message_id == message_id


def test_the_url_policy_is_asked_again_when_the_allowlist_changes(settings):
    """A URL that passed is not checked again per send, until the setting (its allowlist) is replaced."""
    provider = WebhookProvider(ChannelSettings("hook", "webhook", 2.0, 4, {"url": "http://127.0.0.1:9/x"}))
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    provider._check_url()
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": []}
    with pytest.raises(PermanentProviderError) as refused:
        provider._check_url()
    assert refused.value.kind == "url_refused"
