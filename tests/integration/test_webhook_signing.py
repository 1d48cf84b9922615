"""Standard Webhooks signatures, verified on real requests with the ``standardwebhooks`` reference library."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from notifications_retry.providers.base import ChannelSettings
from notifications_retry.providers.webhook import WebhookProvider, fingerprint, masked, secret_problems
from tests.integration.test_webhook_provider import message
from tests.support.http_server import ScriptedServer


def new_secret(size: int = 32) -> str:
    return "whsec_" + base64.b64encode(os.urandom(size)).decode()


def provider_for(server: ScriptedServer, wall_clock=time.time, **options) -> WebhookProvider:
    channel = ChannelSettings("webhook", "webhook", 2.0, 4, {"url": server.url, **options})
    return WebhookProvider(channel, wall_clock=wall_clock)


def test_whsec_secret_signs_per_the_standard_and_the_reference_library_verifies(webhook_server):
    secret = new_secret()
    msg = message()
    provider_for(webhook_server, secret=secret).send(msg)
    (request,) = webhook_server.requests
    assert request.headers["webhook-id"] == str(msg.notification_id)
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 5
    assert request.headers["webhook-signature"].startswith("v1,")
    assert "x-signature" not in request.headers
    assert Webhook(secret).verify(request.body, request.headers) == request.json()


def test_a_tampered_body_fails_verification(webhook_server):
    secret = new_secret()
    provider_for(webhook_server, secret=secret).send(message())
    (request,) = webhook_server.requests
    tampered = request.body.replace(b'"hi"', b'"ho"')
    assert tampered != request.body
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(secret).verify(tampered, request.headers)


def test_a_request_signed_outside_the_tolerance_fails_verification(webhook_server):
    secret = new_secret()
    # The attempt's clock ten minutes behind: the library's tolerance is five.
    provider_for(webhook_server, wall_clock=lambda: time.time() - 600, secret=secret).send(message())
    (request,) = webhook_server.requests
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(request.body, request.headers)


def test_the_timestamp_is_the_attempts_so_each_attempt_signs_anew(webhook_server):
    secret = new_secret()
    times = iter([1_800_000_000.4, 1_800_000_060.9])
    provider = provider_for(webhook_server, wall_clock=lambda: next(times), secret=secret)
    msg = message()
    provider.send(msg)
    provider.send(msg)
    first, second = webhook_server.requests
    assert (first.headers["webhook-timestamp"], second.headers["webhook-timestamp"]) == (
        "1800000000",
        "1800000060",
    )
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert first.headers["webhook-signature"] != second.headers["webhook-signature"]


def test_rotation_signs_with_every_secret_so_old_and_new_receivers_verify(webhook_server):
    old, new = new_secret(), new_secret(24)
    provider_for(webhook_server, secrets=[old, new]).send(message())
    (request,) = webhook_server.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(request.body, request.headers)


def test_secret_and_secrets_sign_together(webhook_server):
    first, second = new_secret(), new_secret()
    provider_for(webhook_server, secret=first, secrets=[second]).send(message())
    (request,) = webhook_server.requests
    for secret in (first, second):
        Webhook(secret).verify(request.body, request.headers)


def test_a_legacy_secret_beside_a_standard_one_sends_both_headers(webhook_server):
    standard = new_secret()
    provider_for(webhook_server, secret="legacy-s3cret", secrets=[standard]).send(message())
    (request,) = webhook_server.requests
    Webhook(standard).verify(request.body, request.headers)
    expected = hmac.new(b"legacy-s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-signature"] == f"sha256={expected}"


def test_configured_headers_cannot_override_the_signature(webhook_server):
    secret = new_secret()
    forged = {"webhook-signature": "v1,forged", "Webhook-Timestamp": "1", "webhook-id": "x"}
    provider_for(webhook_server, secret=secret, headers=forged).send(message())
    (request,) = webhook_server.requests
    Webhook(secret).verify(request.body, request.headers)


def test_no_secret_no_signature_headers(webhook_server):
    provider_for(webhook_server).send(message())
    (request,) = webhook_server.requests
    assert not {"webhook-id", "webhook-timestamp", "webhook-signature", "x-signature"} & set(request.headers)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"secret": "whsec_!!!not-base64"}, "not base64"),
        ({"secret": "whsec_" + base64.b64encode(b"short").decode()}, "24 to 64"),
        ({"secrets": "whsec_abc"}, "must be a list"),
        ({"secrets": ["plain-s3cr3t-value"]}, "must start with whsec_"),
        ({"secrets": [new_secret(), "whsec_" + base64.b64encode(bytes(80)).decode()]}, "entry 2"),
        ({"secret": 5}, "must be a string"),
    ],
)
def test_bad_secrets_are_described_without_quoting_them(options, fragment):
    problems = secret_problems(options)
    assert any(fragment in p for p in problems), problems
    for value in [options.get("secret"), *(options.get("secrets") or [])]:
        if isinstance(value, str) and len(value) > 8:
            assert all(value[6:] not in p for p in problems)
    full = WebhookProvider.options_problems({"url": "https://hooks.example.com/x", **options})
    assert any(fragment in p for p in full)


def test_valid_secrets_have_no_problems():
    assert secret_problems({"secret": "legacy", "secrets": [new_secret(), new_secret(64)]}) == []


def test_masked_shows_the_kind_and_a_fingerprint_never_the_secret():
    secret = new_secret()
    shown = masked(secret)
    assert secret[6:12] not in shown and fingerprint(secret) in shown and "Standard Webhooks" in shown
    assert "legacy" in masked("abc")
