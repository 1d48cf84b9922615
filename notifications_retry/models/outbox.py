"""The transactional outbox: one event per outcome, written with the status change."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Count, Q
from django.utils import timezone

from notifications_retry.database.triggers import outbox_triggers
from notifications_retry.rules.event_ids import DERIVED_EVENT_ID, outbox_event_id

from .notifications import age_seconds, oldest

DISPATCHED_TOPIC = "pin.notifications.dispatched.v1"
#: What an ESP reported after a send (docs/events.md); its events carry the same contract version.
DELIVERY_STATUS_TOPIC = "pin.notifications.delivery-status.v1"
CONTRACT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class OutboxBacklog:
    """What waits for the relay."""

    unpublished: int
    oldest_unpublished_age_seconds: float


class OutboxQuerySet(models.QuerySet["Outbox"]):
    def backlog(self, now: datetime) -> OutboxBacklog:
        """Unpublished events and the age of the oldest (0 when none waits): one statement over the
        partial index on unpublished events."""
        waiting = self.filter(published_at__isnull=True).aggregate(
            count=Count("pk"), oldest=oldest("created_at")
        )
        first = waiting["oldest"] if waiting["count"] else None
        return OutboxBacklog(
            unpublished=waiting["count"], oldest_unpublished_age_seconds=age_seconds(now, first)
        )


class Outbox(models.Model):
    """A transactional outbox row: written with the status change, published by the relay."""

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    topic = models.CharField(max_length=128, default=DISPATCHED_TOPIC)
    key = models.CharField(max_length=64, help_text="The NotificationId as text.")
    contract_version = models.PositiveSmallIntegerField(default=CONTRACT_VERSION)
    generation = models.PositiveIntegerField(
        default=0, help_text="The notification's requeue count at the outcome: one event per outcome."
    )
    payload = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    published_at = models.DateTimeField(null=True, blank=True)

    objects = OutboxQuerySet.as_manager()

    class Meta:
        verbose_name = "outbox event"
        verbose_name_plural = "outbox"
        constraints = [
            # New events cannot repeat an outcome: their id is derived from it and unique. Events
            # written before that (random ids) are the only rows this index holds.
            models.UniqueConstraint(
                fields=["topic", "key", "generation"],
                condition=~Q(event_id=DERIVED_EVENT_ID),
                name="nr_outbox_one_legacy_event_per_outcome",
            ),
        ]
        indexes = [
            models.Index(
                fields=["id"], name="nr_outbox_unpublished_idx", condition=Q(published_at__isnull=True)
            ),
            models.Index(
                fields=["published_at"],
                name="nr_outbox_published_idx",
                condition=Q(published_at__isnull=False),
            ),
        ]
        triggers = outbox_triggers()

    def __str__(self) -> str:
        return f"{self.topic} {self.key} ({'published' if self.published_at else 'pending'})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The database accepts a new event only under the id derived from its outcome.
        if self._state.adding:
            self.event_id = outbox_event_id(self.topic, self.key, self.generation)
        super().save(*args, **kwargs)
