"""The admin's pages as an operator reaches them: dead letters and their events, staff clients holding
chosen permissions, and the changelist's actions."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.delivery.events import dispatched_event
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import NotificationFactory

CHANGELIST = "admin:notifications_retry_notificationentity_changelist"
DASHBOARD = "admin:notifications_retry_notificationentity_dashboard"


@pytest.fixture
def admin_user(db: None) -> User:
    """pytest-django's superuser, without a password (hashing one costs a second per test)."""
    return User.objects.create_superuser("admin", "admin@example.com", password=None)


def dead_letter(**fields: Any) -> NotificationEntity:
    """A terminal Failed row, as the worker leaves it."""
    now = timezone.now()
    values: dict[str, Any] = {
        "status": NotificationEntity.Status.FAILED,
        "attempts": 3,
        "error_kind": "http_4xx",
        "last_error": "webhook answered HTTP 400",
        "dead_lettered_at": now - timedelta(minutes=5),
        "dead_letter_reason": "permanent failure",
        "created_at": now - timedelta(hours=1),
        "attempt_log": [
            {
                "at": (now - timedelta(minutes=20)).isoformat(),
                "attempt": 1,
                "outcome": "retry",
                "error_kind": "timeout",
                "error": "timed out",
            },
            {
                "at": (now - timedelta(minutes=5)).isoformat(),
                "attempt": 2,
                "outcome": "failed",
                "error_kind": "http_4xx",
                "error": "webhook answered HTTP 400",
            },
        ],
    }
    values.update(fields)
    return NotificationFactory(**values)  # type: ignore[no-any-return]


def outbox_event(row: NotificationEntity, *, published: bool = False) -> Outbox:
    """The event the worker writes for a Sent or dead-lettered row (the database checks it matches)."""
    event = dispatched_event(
        generation=row.requeue_count,
        created_at=timezone.now(),
        notification_id=row.pk,
        tenant_id=row.tenant_id,
        channel=row.channel.key,
        status="Sent" if row.status == "sent" else "Failed",
        attempts=row.attempts,
        provider_message_id=row.provider_message_id,
        error=row.last_error,
        error_kind=row.error_kind,
    )
    event.save()
    if published:
        Outbox.objects.filter(pk=event.pk).update(published_at=timezone.now())
        event.refresh_from_db()
    return event


def staff(*perms: str, username: str = "operator") -> Client:
    """A logged-in staff client holding exactly ``perms`` (codenames of the app)."""
    user = User.objects.create_user(username, is_staff=True)  # no password: no slow hashing
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="notifications_retry", codename__in=perms)
    )
    client = Client()
    client.force_login(user)
    return client


def action(client: Client, name: str, ids: list[Any], query: str = "", **extra: Any) -> Any:
    data: dict[str, Any] = {
        "action": name,
        "_selected_action": [str(i) for i in ids],
        "index": "0",
        "select_across": "0",
        **extra,
    }
    return client.post(reverse(CHANGELIST) + query, data)


def ids_in(response: Any) -> set[str]:
    return {str(obj.pk) for obj in response.context["cl"].result_list}


#: A time as a page may show it: a date, hours and minutes, maybe seconds, fraction, offset or zone.
TIME_STAMP = re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d)?(?:\.\d+)?(?:[+-]\d\d:\d\d| UTC)?")
#: Django's own rendering of a DateTimeField (DATETIME_FORMAT "N j, Y, P"): "March 1, 2026, 10 a.m.".
DJANGO_DATETIME = re.compile(
    r"\b(?:Jan|Feb|March|April|May|June|July|Aug|Sept|Oct|Nov|Dec)[a-z]*\.? \d{1,2}, \d{4}|\b[ap]\.m\.|"
    r"\bnoon\b|\bmidnight\b"
)


def assert_admin_times(page: str) -> list[str]:
    """Every time ``page`` shows is in the admin's one format (display.TIMESTAMP_FORMAT, with its zone)."""
    # Form values, links and stored documents (a payload, an answer's excerpt) carry times as machines
    # read them (ISO 8601): the admin shows them as they are, not as times of its own.
    text = re.sub(r'<(?:input|option)[^>]*>|href="[^"]*"|<pre[^>]*>.*?</pre>', "", page, flags=re.S)
    stamps: list[str] = TIME_STAMP.findall(text)
    odd = [s for s in stamps if not re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", s)]
    assert not odd, odd
    assert not DJANGO_DATETIME.search(text), DJANGO_DATETIME.search(text)
    return stamps
