"""A claimed record as the claim returns it, for unit tests that need no database."""

from __future__ import annotations

import uuid
from typing import Any

from notifications_retry.rules.outcomes import ClaimedRecord


def claimed_record(**fields: Any) -> ClaimedRecord:
    """A leased record of channel 1 on its first attempt; ``fields`` override any of its values."""
    values: dict[str, Any] = dict(
        id=uuid.uuid4(),
        tenant_id=None,
        channel_id=1,
        recipient="a@example.com",
        payload={},
        notification_type="",
        priority=0,
        status="failed",
        attempts=1,
        expires_at=None,
        correlation_id="",
        requeue_count=0,
        claim_token=uuid.uuid4(),
    )
    values.update(fields)
    return ClaimedRecord(**values)
