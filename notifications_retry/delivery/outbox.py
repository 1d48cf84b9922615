"""The outbox rows' writes after their insert: marking events published, and pruning published ones.

Events are inserted with their outcome (:mod:`.finalize`); the relay marks what its publisher
accepted, and housekeeping deletes what was published long ago. Unpublished events are never
touched here (the outbox trigger refuses it too).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from notifications_retry.models import Outbox

#: Rows deleted per statement: keeps each transaction short on a large outbox.
DELETE_CHUNK = 5000


def mark_published(ids: Sequence[int], now: datetime) -> int:
    """Mark the events ``ids`` published at ``now`` (those not marked already); returns how many."""
    return Outbox.objects.filter(pk__in=ids, published_at__isnull=True).update(published_at=now)


def prune_published_outbox(*, older_than: datetime, chunk: int = DELETE_CHUNK) -> int:
    """Delete published events published before ``older_than``; unpublished ones are never touched."""
    return sum(prune_published_outbox_batches(older_than=older_than, chunk=chunk))


def prune_published_outbox_batches(*, older_than: datetime, chunk: int = DELETE_CHUNK) -> Iterator[int]:
    """:func:`prune_published_outbox` one short transaction at a time: yields each one's deletions."""
    while True:
        ids = list(
            Outbox.objects.filter(published_at__isnull=False, published_at__lt=older_than)
            .order_by("id")
            .values_list("id", flat=True)[:chunk]
        )
        if not ids:
            return
        # The published_at filter again: the trigger refuses unpublished rows, never rely on that alone.
        deleted, _ = Outbox.objects.filter(pk__in=ids, published_at__isnull=False).delete()
        yield deleted
        if len(ids) < chunk:
            return
