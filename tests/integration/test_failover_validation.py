"""A channel's fallback: validated in clean() (the admin), by the database and by check E008; the
webhook's failures marked ambiguous or not; ``delivered_by`` in the event contract."""

from __future__ import annotations

import socket
import uuid
from datetime import UTC, datetime

import jsonschema
import pytest
from django.core.checks import run_checks
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from notifications_retry.admin.channels import ChannelConfigForm
from notifications_retry.delivery import events
from notifications_retry.exceptions import RetryableProviderError
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
from notifications_retry.providers.webhook import WebhookProvider
from tests.factories import ChannelFactory
from tests.support.http_server import Reply, ScriptedServer

pytestmark = pytest.mark.django_db


def fallback_errors(channel: ChannelConfig) -> list[str]:
    with pytest.raises(ValidationError) as info:
        channel.full_clean()
    return info.value.message_dict["fallback"]


def test_a_channel_cannot_be_its_own_fallback():
    channel = ChannelFactory(key="a")
    channel.fallback = channel
    assert fallback_errors(channel) == ["a channel cannot be its own fallback"]
    with pytest.raises(IntegrityError), transaction.atomic():
        ChannelConfig.objects.filter(pk=channel.pk).update(fallback=channel)  # the database refuses it too


def test_a_disabled_fallback_is_refused():
    channel = ChannelFactory(key="a", fallback=ChannelFactory(key="b", is_enabled=False))
    assert fallback_errors(channel) == ["fallback channel 'b' is disabled"]


def test_a_cycle_is_refused_with_the_chain_named():
    a = ChannelFactory(key="a")
    b = ChannelFactory(key="b", fallback=a)
    ChannelFactory(key="c", fallback=b)
    a.fallback = ChannelConfig.objects.get(key="c")
    assert fallback_errors(a) == ["fallback channels form a cycle: a → c → b → a"]


def test_a_chain_without_a_cycle_is_fine():
    a = ChannelFactory(key="a", fallback=ChannelFactory(key="b", fallback=ChannelFactory(key="c")))
    a.full_clean()
    assert a.fallback_problems() == []


def test_the_admin_form_reports_the_problem_on_the_field_and_never_offers_the_channel_itself():
    a = ChannelFactory(key="a")
    b = ChannelFactory(key="b", fallback=a)
    data = {
        "key": "a",
        "is_enabled": "on",
        "provider_key": "in_app",
        "max_attempts": 3,
        "retry_backoff": "exponential",
        "backoff_base_seconds": 60,
        "backoff_cap_seconds": 3600,
        "timeout_seconds": 5,
        "max_concurrency": 10,
        "options": "{}",
        "fallback": b.pk,
    }
    form = ChannelConfigForm(data=data, instance=a)
    assert a not in form.fields["fallback"].queryset
    assert not form.is_valid()
    assert form.errors["fallback"] == ["fallback channels form a cycle: a → b → a"]
    a.refresh_from_db()
    assert a.fallback is None  # nothing saved


def test_check_e008_reports_a_fallback_made_unusable_past_validation():
    a = ChannelFactory(key="a", fallback=ChannelFactory(key="b"))
    assert not [m for m in run_checks(databases=["default"]) if m.id == "notifications_retry.E008"]
    ChannelConfig.objects.filter(key="b").update(is_enabled=False)
    found = [m.msg for m in run_checks(databases=["default"]) if m.id == "notifications_retry.E008"]
    assert found == ["channel 'a' has an unusable fallback: fallback channel 'b' is disabled"]
    ChannelConfig.objects.filter(key="b").update(is_enabled=True, fallback=a)
    found = [m.msg for m in run_checks(databases=["default"]) if m.id == "notifications_retry.E008"]
    assert sorted(found) == [
        "channel 'a' has an unusable fallback: fallback channels form a cycle: a → b → a",
        "channel 'b' has an unusable fallback: fallback channels form a cycle: b → a → b",
    ]
    # Plain `check` reads the channels too and says the same.
    assert sorted(m.msg for m in run_checks() if m.id == "notifications_retry.E008") == sorted(found)


def message() -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), None, "sms", "+33600000000", {"text": "hi"}, 1, 5, "")


def send_error(url: str) -> RetryableProviderError:
    provider = WebhookProvider(ChannelSettings("sms", "webhook", 2.0, 1, {"url": url}))
    with pytest.raises(RetryableProviderError) as info:
        provider.send(message())
    return info.value


@pytest.mark.parametrize(
    ("reply", "ambiguous"), [(Reply(503), False), (Reply(429), False), (Reply(500), True)]
)
def test_webhook_marks_refusals_before_processing_unambiguous(webhook_server, reply, ambiguous):
    webhook_server.responder = lambda request: reply
    assert send_error(webhook_server.url).ambiguous is ambiguous


def test_webhook_connection_refused_is_unambiguous_a_dropped_answer_is_not(settings):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = send_error(f"http://127.0.0.1:{port}/hook")
    assert (refused.kind, refused.ambiguous) == ("connection", False)
    server = ScriptedServer(lambda request: Reply(hang=True)).start()
    try:
        provider = WebhookProvider(ChannelSettings("sms", "webhook", 0.5, 1, {"url": server.url}))
        with pytest.raises(RetryableProviderError) as info:
            provider.send(message())
    finally:
        server.stop()
    assert (info.value.kind, info.value.ambiguous) == ("timeout", True)


def payload(**overrides):
    values = dict(
        notification_id=uuid.uuid4(),
        tenant_id=None,
        channel="sms",
        status=events.SENT,
        attempts=1,
        provider_message_id="x",
        error=None,
        error_kind=None,
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    values.update(overrides)
    return events.dispatched_payload(**values)


def envelope(body: dict) -> dict:
    return {
        "event_id": str(uuid.uuid4()),
        "topic": "pin.notifications.dispatched.v1",
        "key": body["notification_id"],
        "contract_version": 1,
        "generation": 0,
        "created_at": body["occurred_at"],
        "payload": body,
    }


def test_delivered_by_is_optional_in_contract_v1_and_only_on_sent():
    validator = jsonschema.Draft202012Validator(events.schema())
    assert "delivered_by" not in payload()
    validator.validate(envelope(payload()))
    validator.validate(envelope(payload(delivered_by="sms-backup")))
    failed = payload(status=events.FAILED, provider_message_id=None, error="e", error_kind="http_5xx")
    validator.validate(envelope(failed))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(envelope({**failed, "delivered_by": "sms-backup"}))
    with pytest.raises(ValueError, match="only a Sent event"):
        payload(status=events.FAILED, error_kind="http_5xx", delivered_by="sms-backup")
