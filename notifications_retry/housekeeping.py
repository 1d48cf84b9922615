"""Housekeeping: expire stale dead letters, prune published outbox rows, old backlog samples and
suppressions whose expiry has passed.

Run it daily (``manage.py notifications_housekeeping``). Each step is a short transaction (or a few,
for large deletions), so it can run next to the worker and the relay.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import structlog
from django.utils import timezone

from notifications_retry.delivery.suppression import prune_expired
from notifications_retry.delivery.triage import expire_dead_letters

from .conf import get_settings
from .models import BacklogSample, Outbox

log = structlog.get_logger("notifications_retry.housekeeping")

#: Rows deleted per statement: keeps each transaction short on a large outbox.
DELETE_CHUNK = 5000


@dataclasses.dataclass(frozen=True)
class HousekeepingReport:
    """How many rows each step touched."""

    expired_dead_letters: int
    pruned_outbox: int
    pruned_backlog_samples: int
    pruned_suppressions: int = 0


def prune_published_outbox(*, older_than: datetime, chunk: int = DELETE_CHUNK) -> int:
    """Delete published events published before ``older_than``; unpublished ones are never touched."""
    total = 0
    while True:
        ids = list(
            Outbox.objects.filter(published_at__isnull=False, published_at__lt=older_than)
            .order_by("id")
            .values_list("id", flat=True)[:chunk]
        )
        if not ids:
            return total
        # The published_at filter again: the trigger refuses unpublished rows, never rely on that alone.
        deleted, _ = Outbox.objects.filter(pk__in=ids, published_at__isnull=False).delete()
        total += deleted
        if len(ids) < chunk:
            return total


def prune_backlog_samples(*, older_than: datetime) -> int:
    """Delete backlog samples taken before ``older_than``."""
    deleted, _ = BacklogSample.objects.filter(taken_at__lt=older_than).delete()
    return deleted


def run_housekeeping(
    *,
    now: datetime | None = None,
    dead_letter_retention: timedelta | None = None,
    outbox_retention: timedelta | None = None,
    sample_retention: timedelta | None = None,
) -> HousekeepingReport:
    """Every step, with retentions from the settings unless given."""
    conf = get_settings()
    now = now or timezone.now()
    dead_letter_retention = dead_letter_retention or timedelta(days=conf.DEAD_LETTER_RETENTION_DAYS)
    outbox_retention = outbox_retention or timedelta(days=conf.OUTBOX_RETENTION_DAYS)
    sample_retention = sample_retention or timedelta(hours=conf.BACKLOG_SAMPLE_RETENTION_HOURS)
    report = HousekeepingReport(
        expired_dead_letters=expire_dead_letters(retention=dead_letter_retention, now=now),
        pruned_outbox=prune_published_outbox(older_than=now - outbox_retention),
        pruned_backlog_samples=prune_backlog_samples(older_than=now - sample_retention),
        pruned_suppressions=prune_expired(now=now),
    )
    log.info("housekeeping-completed", **dataclasses.asdict(report))
    return report
