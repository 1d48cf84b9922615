"""Bad input to the public API is refused before the database, naming the field, and nothing is stored.

Each case once reached PostgreSQL raw (a psycopg ``DataError``) or failed deep in Python (``TypeError``,
``RecursionError``), or was stored as is (a 20 MB payload).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from notifications_retry import api
from notifications_retry.inputs.validation import InvalidNotification
from notifications_retry.models import NotificationEntity
from notifications_retry.providers.base import Provider
from tests.factories import ChannelFactory

pytestmark = pytest.mark.django_db


def deep(levels: int) -> dict[str, Any]:
    inner: Any = []
    for _ in range(levels):
        inner = [inner]
    return {"deep": inner}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"recipient": "a\x00b"}, "recipient"),
        ({"payload": {"body": "a\x00b"}}, "payload['body']"),
        ({"notification_type": "t" * 65}, "notification_type"),
        ({"notification_type": "a\x00"}, "notification_type"),
        ({"priority": 40000}, "priority"),
        ({"payload": {"at": timezone.now()}}, "payload['at']"),
        ({"payload": "a string"}, "payload"),
        ({"payload": deep(100_000)}, "payload['deep']" + "[0]" * 31),
        ({"payload": {"blob": "x" * (20 * 1024 * 1024)}}, "payload"),
        ({"correlation_id": "c" * 65}, "correlation_id"),
    ],
    ids=[
        "nul-recipient",
        "nul-payload",
        "long-type",
        "nul-type",
        "priority",
        "non-json",
        "string-payload",
        "deep",
        "20mb",
        "long-correlation",
    ],
)
def test_create_refuses_bad_input_naming_the_field_and_stores_nothing(
    fields: dict[str, Any], field: str, django_capture_on_commit_callbacks: Any
) -> None:
    ChannelFactory(key="in_app")
    announced: list[NotificationEntity] = []
    values: dict[str, Any] = {"channel": "in_app", "recipient": "user-1", "payload": {"ok": 1}, **fields}
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(InvalidNotification) as info:
        api.create_notification(on_commit=announced.append, **values)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert NotificationEntity.objects.count() == 0
    assert announced == []


def test_schedule_applies_the_same_rules() -> None:
    ChannelFactory(key="email")
    with pytest.raises(InvalidNotification, match=r"^recipient: contains a NUL byte"):
        api.schedule_notification(channel="email", recipient="a\x00b", send_at=timezone.now())
    assert NotificationEntity.objects.count() == 0


def test_the_payload_limit_follows_the_setting() -> None:
    ChannelFactory(key="in_app")
    payload = {"blob": "x" * 5000}
    with (
        override_settings(NOTIFICATIONS_RETRY={"MAX_PAYLOAD_BYTES": 4096}),
        pytest.raises(InvalidNotification, match="at most 4096 are accepted"),
    ):
        api.create_notification(channel="in_app", recipient="u", payload=payload)
    stored = api.create_notification(channel="in_app", recipient="u", payload=payload)
    assert NotificationEntity.objects.get(pk=stored.pk).payload == payload


def test_the_depth_limit_follows_the_setting() -> None:
    ChannelFactory(key="in_app")
    with override_settings(NOTIFICATIONS_RETRY={"MAX_PAYLOAD_DEPTH": 3}):
        with pytest.raises(InvalidNotification, match="nests deeper than 3 levels"):
            api.create_notification(channel="in_app", recipient="u", payload=deep(3))
        api.create_notification(channel="in_app", recipient="u", payload=deep(1))
    assert NotificationEntity.objects.count() == 1


def test_a_valid_notification_is_stored_as_given() -> None:
    ChannelFactory(key="in_app")
    payload = {
        "title": "Shipped",
        "items": [{"sku": "A", "qty": 2, "price": 9.5, "gift": False, "note": None}],
    }
    row = api.create_notification(
        channel="in_app", recipient="user-1", payload=payload, notification_type="t" * 64, priority=32767
    )
    row.refresh_from_db()
    assert (row.payload, row.notification_type, row.priority) == (payload, "t" * 64, 32767)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"recipient": "a\x00b"}, "recipient"),
        ({"recipient": "x" * 4097}, "recipient"),
        ({"notification_type": "a\x00b"}, "notification_type"),
        ({"correlation_id": "a\x00b"}, "correlation_id"),
        ({"payload": {"n": float("nan")}}, "payload"),
        ({"payload": "text"}, "payload"),
        ({"payload": deep(100_000)}, "payload"),
        ({"priority": 40000}, "priority"),
    ],
)
def test_full_clean_applies_the_same_rules(fields: dict[str, Any], field: str) -> None:
    values: dict[str, Any] = {"recipient": "u", "payload": {}, **fields}
    row = NotificationEntity(channel=ChannelFactory(key="in_app"), **values)
    with pytest.raises(ValidationError) as info:
        row.full_clean()
    assert field in info.value.message_dict, info.value.message_dict


# --- what could never be sent is refused at the door ---------------------------------------------------

EMAIL = {"subject": "Your order", "body": "It shipped."}


class FaxProvider(Provider):
    """A custom provider that declares what its payload needs."""

    key = "fax"
    required_payload_keys = (("pages",), ("cover", "cover_url"))


def refused(field: str, **values: Any) -> InvalidNotification:
    """Create (or schedule, with ``send_at``) ``values``: refused on ``field``, with nothing stored."""
    create = api.schedule_notification if "send_at" in values else api.create_notification
    with pytest.raises(InvalidNotification) as info:
        create(recipient=values.pop("recipient", "ann@example.com"), **values)
    assert (info.value.field, str(info.value).split(":")[0]) == (field, field), str(info.value)
    assert NotificationEntity.objects.count() == 0
    return info.value


@pytest.mark.parametrize("create", ["create", "schedule"])
def test_an_unknown_channel_is_refused_naming_the_channel_field(create: str) -> None:
    ChannelFactory(key="in_app")
    ChannelFactory(key="email", provider_key="django_email")
    timing = {"send_at": timezone.now()} if create == "schedule" else {}
    error = refused("channel", channel="nope", **timing)
    assert "no channel with key 'nope' (known: email, in_app)" in str(error)


def test_a_disabled_channel_is_accepted_its_rows_wait() -> None:
    ChannelFactory(key="email", provider_key="django_email", is_enabled=False)
    row = api.create_notification(channel="email", recipient="ann@example.com", payload=EMAIL)
    assert NotificationEntity.objects.get(pk=row.pk).status == NotificationEntity.Status.PENDING


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"body": "It shipped."}, "'subject' is required"),
        ({"subject": "Your order"}, "'body' or 'html' is required"),
        ({}, "'subject' is required"),
        ({**EMAIL, "subject": 5}, "'subject' must be a non-empty string"),
        ({**EMAIL, "attachments": []}, "unknown payload key(s) attachments"),
        ({**EMAIL, "from": "not an address"}, "'from' is not an email address"),
    ],
)
@pytest.mark.parametrize("create", ["create", "schedule"])
def test_an_email_payload_that_cannot_be_sent_is_refused_naming_the_key(
    create: str, payload: dict[str, Any], named: str
) -> None:
    ChannelFactory(key="email", provider_key="django_email")
    timing = {"send_at": timezone.now() + timedelta(hours=1)} if create == "schedule" else {}
    error = refused("payload", channel="email", payload=payload, **timing)
    assert named in str(error) and "channel 'email' (django_email)" in str(error), str(error)


def test_an_email_payload_with_a_subject_and_a_body_or_html_is_accepted() -> None:
    ChannelFactory(key="email", provider_key="django_email")
    api.create_notification(channel="email", recipient="ann@example.com", payload=EMAIL)
    api.create_notification(
        channel="email", recipient="ann@example.com", payload={"subject": "s", "html": "<p>"}
    )
    assert NotificationEntity.objects.count() == 2


def test_a_provider_s_declared_payload_keys_are_required_other_providers_take_any_object() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"fax": f"{__name__}.FaxProvider"}}):
        ChannelFactory(key="fax", provider_key="fax")
        error = refused("payload", channel="fax", payload={"cover": "x"})
        assert "'pages' is required" in str(error)
        error = refused("payload", channel="fax", payload={"pages": 2, "cover": None})
        assert "'cover' or 'cover_url' is required" in str(error)
        api.create_notification(channel="fax", recipient="+15550100", payload={"pages": 2, "cover_url": "u"})
    for key, provider_key in (("in_app", "in_app"), ("hook", "webhook"), ("odd", "no-such-provider")):
        ChannelFactory(key=key, provider_key=provider_key)
        # A channel whose provider is unknown is the channel's problem: its rows wait until it is fixed.
        api.create_notification(channel=key, recipient="u", payload={"anything": [1]})
    assert NotificationEntity.objects.count() == 4


@pytest.mark.parametrize("offset", [timedelta(0), -timedelta(seconds=1)])
def test_expires_at_at_or_before_send_at_is_refused(offset: timedelta) -> None:
    ChannelFactory(key="in_app")
    send_at = timezone.now() + timedelta(hours=1)
    error = refused("expires_at", channel="in_app", send_at=send_at, expires_at=send_at + offset)
    assert "it would expire unsent" in str(error) and send_at.isoformat() in str(error)


def test_expires_at_already_past_on_a_fresh_notification_is_refused() -> None:
    ChannelFactory(key="in_app")
    refused("expires_at", channel="in_app", expires_at=timezone.now() - timedelta(seconds=1))


def test_expires_at_after_send_at_is_stored() -> None:
    ChannelFactory(key="in_app")
    send_at = timezone.now() + timedelta(hours=1)
    row = api.schedule_notification(
        channel="in_app", recipient="u", send_at=send_at, expires_at=send_at + timedelta(seconds=1)
    )
    fresh = api.create_notification(
        channel="in_app", recipient="u", expires_at=timezone.now() + timedelta(minutes=5)
    )
    assert NotificationEntity.objects.get(pk=row.pk).expires_at == send_at + timedelta(seconds=1)
    assert NotificationEntity.objects.filter(pk=fresh.pk).exists()
