"""Create: a new Pending notification, inserted in the caller's transaction.

The caller (``api.create_notification``) has validated every field already; fresh rows are announced
to the monolith's dispatcher by the caller, once the transaction commits.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from notifications_retry.models import NotificationEntity


def create_pending(**fields: Any) -> NotificationEntity:
    """Insert one Pending notification of ``fields`` (a savepoint inside the caller's transaction)."""
    with transaction.atomic():
        return NotificationEntity.objects.create(status=NotificationEntity.Status.PENDING, **fields)
