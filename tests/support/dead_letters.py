"""Dead letters by the thousand, inserted by SQL (a factory would take minutes for 200,000)."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from notifications_retry.models import ChannelConfig

INSERT_DEAD_LETTERS = """
INSERT INTO notifications_retry_notificationentity (
    id, tenant_id, recipient, payload, notification_type, priority, status, attempts, next_attempt_at,
    last_error, error_kind, attempt_log, dead_lettered_at, dead_letter_reason, resolution, requeue_count,
    correlation_id, created_at, updated_at, channel_id)
SELECT gen_random_uuid(), NULL, 'user' || g || '@example.com', jsonb_build_object('n', g), '', 5, 'failed',
       %(attempts)s, NULL, 'HTTP 503', 'http_503', '[]',
       %(first)s + (g - 1)::bigint * %(step)s::bigint * interval '1 microsecond', 'attempts exhausted',
       %(resolution)s, 0, '',
       %(first)s, %(first)s, %(channel)s
FROM generate_series(1, %(count)s) g
"""


def seed_dead_letters(
    channel: ChannelConfig,
    count: int,
    *,
    first: datetime,
    step_us: int = 1000,
    resolution: str = "",
) -> None:
    """``count`` dead letters of ``channel``, dead-lettered ``step_us`` microseconds apart from ``first``."""
    with connection.cursor() as cursor:
        cursor.execute(
            INSERT_DEAD_LETTERS,
            {
                "channel": channel.pk,
                "count": count,
                "first": first,
                "step": step_us,
                "attempts": channel.max_attempts,
                "resolution": resolution,
            },
        )
