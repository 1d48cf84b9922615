"""Housekeeping: expire stale dead letters, prune published outbox rows, old backlog samples,
suppressions whose expiry has passed and endpoint-health buckets that left the health window.

Run it daily (``manage.py notifications_housekeeping``). Each step is a short transaction (or a few,
for large deletions), so it can run next to the worker and the relay. The notification and outbox
rows are written by :mod:`notifications_retry.delivery` (``triage``, ``outbox``, ``suppression``).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import structlog
from django.utils import timezone

from notifications_retry.delivery.health import prune_buckets
from notifications_retry.delivery.outbox import prune_published_outbox
from notifications_retry.delivery.suppression import prune_expired
from notifications_retry.delivery.triage import expire_dead_letters

from .conf import get_settings
from .models import BacklogSample

log = structlog.get_logger("notifications_retry.housekeeping")


@dataclasses.dataclass(frozen=True)
class HousekeepingReport:
    """How many rows each step touched."""

    expired_dead_letters: int
    pruned_outbox: int
    pruned_backlog_samples: int
    pruned_suppressions: int = 0
    pruned_health_buckets: int = 0


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
        pruned_health_buckets=prune_buckets(now=now),
    )
    log.info("housekeeping-completed", **dataclasses.asdict(report))
    return report
