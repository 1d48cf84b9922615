"""Bad input to the public API is refused before the database, naming the field, and nothing is stored.

Each case once reached PostgreSQL raw (a psycopg ``DataError``) or failed deep in Python (``TypeError``,
``RecursionError``), or was stored as is (a 20 MB payload).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from notifications_retry import api
from notifications_retry.models import NotificationEntity
from notifications_retry.validation import InvalidNotification
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
