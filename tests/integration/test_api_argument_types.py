"""Every argument of every public API function, given a string, a naive datetime, bytes or None where
that is not what it takes, raises ``InvalidNotification`` naming the argument, and changes nothing.

Hypothesis draws the wrong values; the other arguments are valid, so the one named is the one drawn.
Before, ``schedule_notification(send_at="2026-12-04T09:00")`` raised ``AttributeError`` from Django,
``send_at=None`` stored a fresh notification, and ``requeue_dead_letters("…")`` iterated the string.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notifications_retry import api
from notifications_retry.inputs.validation import InvalidNotification
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)

STRINGS = st.text(max_size=40)
NAIVE = st.datetimes()  # naive: no timezones strategy given
BYTES = st.binary(max_size=40)
NONE = st.none()

# (function, argument) -> the kinds of wrong value to draw. A string is the right type for text
# arguments (recipient, actor…), None for optional ones (tenant_id, now…); those kinds are left out.
WRONG: dict[tuple[str, str], list[st.SearchStrategy[Any]]] = {
    ("create", "channel"): [NAIVE, BYTES, NONE],
    ("create", "recipient"): [NAIVE, BYTES, NONE],
    ("create", "payload"): [STRINGS, NAIVE, BYTES],
    ("create", "tenant_id"): [STRINGS, NAIVE, BYTES],
    ("create", "notification_type"): [NAIVE, BYTES, NONE],
    ("create", "priority"): [STRINGS, NAIVE, BYTES, NONE],
    ("create", "scheduled_at"): [STRINGS, NAIVE, BYTES],
    ("create", "expires_at"): [STRINGS, NAIVE, BYTES],
    ("create", "correlation_id"): [NAIVE, BYTES, NONE],
    ("create", "notification_id"): [STRINGS, NAIVE, BYTES],
    ("create", "on_commit"): [STRINGS, NAIVE, BYTES],
    ("schedule", "send_at"): [STRINGS, NAIVE, BYTES, NONE],
    ("cancel", "notification"): [STRINGS, NAIVE, BYTES, NONE],
    ("cancel", "actor"): [NAIVE, BYTES, NONE],
    ("cancel", "reason"): [NAIVE, BYTES, NONE],
    ("cancel", "now"): [STRINGS, NAIVE, BYTES],
    ("requeue", "ids"): [STRINGS, NAIVE, BYTES, NONE],
    ("requeue", "actor"): [NAIVE, BYTES, NONE],
    ("requeue", "reason"): [NAIVE, BYTES, NONE],
    ("requeue", "now"): [STRINGS, NAIVE, BYTES],
    ("discard", "ids"): [STRINGS, NAIVE, BYTES, NONE],
    ("discard", "actor"): [NAIVE, BYTES, NONE],
    ("discard", "reason"): [NAIVE, BYTES, NONE],
    ("discard", "now"): [STRINGS, NAIVE, BYTES],
    ("queue_stats", "now"): [STRINGS, NAIVE, BYTES],
    ("sent", "notification"): [STRINGS, NAIVE, BYTES, NONE],
    ("sent", "provider_message_id"): [NAIVE, BYTES],
    ("sent", "now"): [STRINGS, NAIVE, BYTES],
    ("failure", "notification"): [STRINGS, NAIVE, BYTES, NONE],
    ("failure", "error"): [NAIVE, BYTES, NONE],
    ("failure", "retriable"): [STRINGS, NAIVE, BYTES, NONE],
    ("failure", "error_kind"): [NAIVE, BYTES, NONE],
    ("failure", "retry_after"): [STRINGS, NAIVE, BYTES],
    ("failure", "now"): [STRINGS, NAIVE, BYTES],
    ("failure", "rng"): [STRINGS, NAIVE, BYTES],
    ("send_now", "notification"): [STRINGS, NAIVE, BYTES, NONE],
    ("send_now", "rng"): [STRINGS, NAIVE, BYTES],
    ("suppress", "recipient"): [NAIVE, BYTES, NONE],
    ("suppress", "channel"): [NAIVE, BYTES, NONE],
    ("suppress", "reason"): [NAIVE, BYTES, NONE],
    ("unsuppress", "recipient"): [NAIVE, BYTES, NONE],
    ("unsuppress", "channel"): [NAIVE, BYTES, NONE],
    ("is_suppressed", "recipient"): [NAIVE, BYTES, NONE],
    ("is_suppressed", "channel"): [NAIVE, BYTES, NONE],
}

Call = Callable[..., Any]


def valid_arguments(function: str, row: NotificationEntity) -> tuple[Call, dict[str, Any]]:
    """The function and a set of arguments it accepts, for ``row`` (a fresh Pending notification)."""
    triage = {"actor": "oncall", "reason": "", "now": NOW}
    calls: dict[str, tuple[Call, dict[str, Any]]] = {
        "create": (
            api.create_notification,
            {
                "channel": "in_app",
                "recipient": "user-1",
                "payload": {"a": 1},
                "tenant_id": uuid.uuid4(),
                "notification_type": "t",
                "priority": 0,
                "scheduled_at": NOW,
                "expires_at": None,
                "correlation_id": "c",
                "notification_id": uuid.uuid4(),
                "on_commit": None,
            },
        ),
        "schedule": (api.schedule_notification, {"channel": "in_app", "recipient": "u", "send_at": NOW}),
        "cancel": (api.cancel_notification, {"notification": row, **triage}),
        "requeue": (api.requeue_dead_letters, {"ids": [row.pk], **triage}),
        "discard": (api.discard_dead_letters, {"ids": [row.pk], **triage}),
        "queue_stats": (api.queue_stats, {"now": NOW}),
        "sent": (api.record_dispatch_sent, {"notification": row, "provider_message_id": "m", "now": NOW}),
        "failure": (
            api.record_dispatch_failure,
            {
                "notification": row,
                "error": "gateway answered 503",
                "retriable": True,
                "error_kind": "dispatch_failed",
                "retry_after": 30,
                "now": NOW,
                "rng": random.Random(1),
            },
        ),
        "send_now": (api.send_now, {"notification": row, "rng": random.Random(1)}),
        "suppress": (
            api.suppress,
            {"recipient": "user-9@example.com", "channel": "in_app", "reason": "manual"},
        ),
        "unsuppress": (api.unsuppress, {"recipient": "user-9@example.com", "channel": "in_app"}),
        "is_suppressed": (api.is_suppressed, {"recipient": "user-9@example.com", "channel": "in_app"}),
    }
    return calls[function]


def not_a_uuid(value: object) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return True
    return False


@pytest.mark.parametrize(("function", "argument"), list(WRONG), ids=[f"{f}-{a}" for f, a in WRONG])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_wrong_value_is_refused_naming_the_argument_and_changes_nothing(
    function: str, argument: str, data: st.DataObject, transactional_db: None
) -> None:
    ChannelFactory(key="in_app")
    row = NotificationFactory(channel__key="in_app", tenant_id=None)
    rows = NotificationEntity.objects.values_list("pk", "status", "attempts", "updated_at")
    snapshot = sorted(rows)
    call, arguments = valid_arguments(function, row)
    wrong = data.draw(st.one_of(*WRONG[(function, argument)]).filter(not_a_uuid), label=argument)
    with pytest.raises(InvalidNotification) as info:
        call(**{**arguments, argument: wrong})
    assert info.value.field.split("[")[0] == argument, str(info.value)
    assert str(info.value).startswith(f"{info.value.field}: ")
    assert sorted(rows) == snapshot
    NotificationEntity.objects.all().delete()


@pytest.mark.parametrize("function", sorted({f for f, _ in WRONG}))
def test_the_valid_arguments_are_accepted(function: str, transactional_db: None) -> None:
    """The baseline the test above changes one argument of: without this it could pass vacuously."""
    ChannelFactory(key="in_app")
    row = NotificationFactory(channel__key="in_app", tenant_id=None)
    if function in ("requeue", "discard"):
        row.status = NotificationEntity.Status.FAILED
        row.dead_lettered_at = NOW
        row.save()
    call, arguments = valid_arguments(function, row)
    call(**arguments)


def test_the_issue_s_string_send_at_is_refused_by_name() -> None:
    ChannelFactory(key="in_app")
    with pytest.raises(InvalidNotification, match=r"^send_at: must be an aware datetime, got str"):
        api.schedule_notification(channel="in_app", recipient="u", send_at="2026-12-04T09:00")
    with pytest.raises(TypeError):  # also a TypeError, as tenant_id=5 always was
        api.schedule_notification(channel="in_app", recipient="u", send_at=None)
    assert not NotificationEntity.objects.exists()
