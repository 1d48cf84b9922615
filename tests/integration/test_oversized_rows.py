"""Size and shape limits hold for every claimed row, not only for the rows the API wrote.

Rows below are written by raw SQL, as a bad migration, a restore or a hand-written UPDATE would. Each
one over a limit is set aside at claim: a dead letter (``payload_too_large`` / ``payload_invalid``), one
event, no provider call; the rows beside it are sent.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from notifications_retry.runtime.clock import ManualClock
from tests.conftest import allow_loopback
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import ScriptedServer

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status
MAX = 256 * 1024  # MAX_PAYLOAD_BYTES' default


def _due(clock: ManualClock, channel: Any) -> NotificationEntity:
    return NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=clock.now() - timedelta(seconds=5)
    )


def _raw(row: NotificationEntity, assignment: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE notifications_retry_notificationentity SET {assignment} WHERE id = %s", [row.pk]
        )


#: (assignment written by raw SQL, error kind, the reason's words); None: within the limits, sent.
ROWS: dict[str, tuple[str, str | None, str]] = {
    "payload of 8 MiB": (
        "payload = jsonb_build_object('body', repeat('x', 8 * 1024 * 1024))",
        "payload_too_large",
        "payload is 8,388,620 bytes as stored; at most 262,144 are accepted (MAX_PAYLOAD_BYTES",
    ),
    "payload just over the limit as compact JSON": (
        f"payload = jsonb_build_object('body', repeat('x', {MAX}))",
        "payload_too_large",
        f"payload is {MAX + 11:,} bytes as JSON; at most 262,144 are accepted",
    ),
    "recipient of 10 MiB": (
        "recipient = repeat('r', 10 * 1024 * 1024)",
        "payload_too_large",
        "recipient is 10,485,760 characters; at most 4,096 are accepted",
    ),
    "payload that is an array": (
        "payload = '[1, 2, 3]'::jsonb",
        "payload_invalid",
        "payload is a JSON array",
    ),
    "payload that is a string": (
        "payload = '\"hello\"'::jsonb",
        "payload_invalid",
        "payload is a JSON string",
    ),
    "payload that is null": ("payload = 'null'::jsonb", "payload_invalid", "payload is a JSON null"),
    # Under the limit as the API measures it (compact), over it as PostgreSQL prints it (with spaces).
    "payload whose printed text alone is over the limit": (
        f"payload = jsonb_build_object('n', (SELECT jsonb_agg(1) FROM generate_series(1, {MAX // 2 - 8})))",
        None,
        "",
    ),
}


def test_rows_over_the_limits_are_set_aside_at_claim_and_the_rest_is_sent(
    settings: Any, clock: ManualClock
) -> None:
    allow_loopback(settings)
    server = ScriptedServer().start()
    try:
        hook = ChannelFactory(
            key="hook",
            provider_key="webhook",
            options={"url": server.url},
            max_concurrency=4,
            timeout_seconds=5,
        )
        odd = {}
        for name, (assignment, _, _) in ROWS.items():
            odd[name] = row = _due(clock, hook)
            _raw(row, assignment)
        healthy = [_due(clock, hook) for _ in range(5)]
        worker = Worker(clock=clock, rng=random.Random(2))
        try:
            assert worker.tick().error == ""
        finally:
            worker.close()
    finally:
        server.stop()
    called = set(server.keys())
    assert {str(r.pk) for r in healthy} <= called
    for name, (_, kind, words) in ROWS.items():
        pk = odd[name].pk
        status, error_kind, reason = (
            NotificationEntity.objects.filter(pk=pk)
            .values_list("status", "error_kind", "dead_letter_reason")
            .get()
        )
        if kind is None:
            assert status == Status.SENT, name
            continue
        assert (status, error_kind) == (Status.FAILED, kind), name
        assert reason.startswith(f"{kind}: {words}"), (name, reason)
        assert "nothing was sent" in reason
        assert str(pk) not in called, name
        assert Outbox.objects.filter(key=str(pk)).count() == 1, name
