"""Due Failed rows of one tenant on a channel, bulk-created through the ORM, for claim and tick tests."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.runtime.clock import Clock
from tests.factories import NotificationFactory


def due_rows(
    clock: Clock,
    channel: ChannelConfig,
    tenant: uuid.UUID | None,
    count: int,
    *,
    ago: float,
    spread: float = 1.0,
    **fields: Any,
) -> list[NotificationEntity]:
    """``count`` Failed rows of ``tenant``, the first due ``ago`` seconds back, each ``spread`` later."""
    return NotificationEntity.objects.bulk_create(
        NotificationFactory.build(
            channel=channel,
            tenant_id=tenant,
            status=NotificationEntity.Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=ago - i * spread),
            **fields,
        )
        for i in range(count)
    )
