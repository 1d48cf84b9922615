"""Every dead-letter reason the app writes, as a triager reads it on the notification's admin page.

Each case makes its dead letter through the path that writes it (a tick, a cancel, the dispatcher's
hand-off), from rows as the API or raw SQL leaves them, and checks the exact text the admin shows.
"""

from __future__ import annotations

import html
import random
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from notifications_retry import api
from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.runtime.clock import ManualClock
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status


def _due(clock: ManualClock, channel: ChannelConfig, **fields: Any) -> NotificationEntity:
    values: dict[str, Any] = {
        "status": Status.FAILED,
        "attempts": 1,
        "next_attempt_at": clock.now() - timedelta(seconds=5),
    }
    values.update(fields)
    return NotificationFactory(channel=channel, **values)


def _raw(row: NotificationEntity, assignment: str, *params: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE notifications_retry_notificationentity SET {assignment} WHERE id = %s", [*params, row.pk]
        )


def _tick(clock: ManualClock) -> None:
    worker = Worker(clock=clock, rng=random.Random(5))
    try:
        assert worker.tick().error == ""
    finally:
        worker.close()


def _in_app(clock: ManualClock) -> ChannelConfig:
    return ChannelFactory(key="in_app", provider_key="in_app", max_attempts=3)


def last_attempt_never_finished(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock), attempts=3)
    _tick(clock)
    return row.pk, (
        "attempts_exhausted: attempt budget of 3 spent (the last attempt never finished: the worker "
        "stopped or crashed during it)"
    )


def budget_lowered(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock), attempts=7)
    _tick(clock)
    return (
        row.pk,
        "attempts_exhausted: 7 attempts already counted, past the attempt budget of 3 "
        "(the budget was lowered since)",
    )


def impossible_attempt_count(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    _raw(row, "attempts = 2147483647")
    _tick(clock)
    return row.pk, (
        "attempts_invalid: attempt count 2147483647 is impossible: the worker counts at most 100 attempts "
        "(the largest budget), so it was written outside the app; nothing was sent"
    )


def deadline_passed(clock: ManualClock) -> tuple[uuid.UUID, str]:
    deadline = clock.now() - timedelta(hours=1)
    row = _due(clock, _in_app(clock), expires_at=deadline)
    _tick(clock)
    return row.pk, f"expired: deadline {deadline.isoformat()} passed before sending"


def deadline_minus_infinity(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    _raw(row, "expires_at = '-infinity'")
    _tick(clock)
    return (
        row.pk,
        "expired: deadline -infinity (stored as '-infinity' or a date before year 2) passed before sending",
    )


def deadline_before_1970(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    _raw(row, "expires_at = '1969-07-20 20:17+00'")
    _tick(clock)
    return row.pk, (
        "expired: deadline 1969-07-20T20:17:00+00:00 (before 1970, so it was always past) "
        "passed before sending"
    )


def undecodable_payload(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    # An object nested deeper than Python's JSON decoder goes, within PostgreSQL's stack.
    _raw(row, "payload = (repeat('{\"a\":', 12000) || '1' || repeat('}', 12000))::jsonb")
    _tick(clock)
    return (
        row.pk,
        # Python's own words follow, and differ by version.
        "undecodable_payload: payload cannot be decoded: RecursionError: maximum recursion depth exceeded…",
    )


def payload_too_large(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    _raw(row, "payload = jsonb_build_object('body', repeat('x', 1024 * 1024))")
    _tick(clock)
    return row.pk, (
        "payload_too_large: payload is 1,048,588 bytes as stored; at most 262,144 are accepted "
        "(MAX_PAYLOAD_BYTES; written past the API: nothing was sent)"
    )


def payload_not_an_object(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    _raw(row, 'payload = \'["a", "b"]\'::jsonb')
    _tick(clock)
    return (
        row.pk,
        "payload_invalid: payload is a JSON array, not an object (written past the API: nothing was sent)",
    )


def blank_recipient(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = _due(clock, _in_app(clock))
    _raw(row, "recipient = '   '")
    _tick(clock)
    return row.pk, "invalid_recipient: recipient '   ' is empty"


def provider_refused(clock: ManualClock) -> tuple[uuid.UUID, str]:
    channel = ChannelFactory(key="sms", provider_key="stub", options={"fail": "permanent"})
    row = _due(clock, channel)
    _tick(clock)
    return row.pk, "stub_permanent: stub told to fail (permanent)"


def retries_spent(clock: ManualClock) -> tuple[uuid.UUID, str]:
    channel = ChannelFactory(key="sms", provider_key="stub", options={"fail": "retriable"}, max_attempts=2)
    row = _due(clock, channel)
    _tick(clock)
    return row.pk, "stub_retriable: stub told to fail (retriable)"


def cancelled(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = NotificationFactory(channel=_in_app(clock), status=Status.PENDING)
    api.cancel_notification(row, actor="billing", reason="order withdrawn", now=clock.now())
    return row.pk, "cancelled: cancelled by billing: order withdrawn"


def dispatcher_gave_up(clock: ManualClock) -> tuple[uuid.UUID, str]:
    row = NotificationFactory(channel=_in_app(clock), status=Status.PENDING)
    api.record_dispatch_failure(row, error="SMTP said 550 no such user", retriable=False, now=clock.now())
    return row.pk, "dispatch_failed: SMTP said 550 no such user"


CASES: list[Callable[[ManualClock], tuple[uuid.UUID, str]]] = [
    last_attempt_never_finished,
    budget_lowered,
    impossible_attempt_count,
    deadline_passed,
    deadline_minus_infinity,
    deadline_before_1970,
    undecodable_payload,
    payload_too_large,
    payload_not_an_object,
    blank_recipient,
    provider_refused,
    retries_spent,
    cancelled,
    dispatcher_gave_up,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_the_admin_shows_what_happened(
    admin_client: Client, clock: ManualClock, case: Callable[[ManualClock], tuple[uuid.UUID, str]]
) -> None:
    pk, reason = case(clock)
    row = NotificationEntity.objects.defer("payload").get(pk=pk)  # one payload Python cannot decode
    assert row.dead_lettered_at is not None
    if reason.endswith("…"):
        assert row.dead_letter_reason.startswith(reason[:-1])
    else:
        assert row.dead_letter_reason == reason
    page = admin_client.get(reverse("admin:notifications_retry_notificationentity_change", args=[pk]))
    assert page.status_code == 200
    assert html.escape(row.dead_letter_reason) in page.content.decode()
